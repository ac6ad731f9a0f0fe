"""The engine: prefill once, decode B rows per pass (decode.py), and the public functions built on
it: next_token_table (tables.py), generate and stream_generate (generate.py), sample
(experiments.py); grammar masks (constrain.py) and the benchmark against mlx-lm (bench.py)."""
