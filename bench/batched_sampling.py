"""Seeded experiments, batched: draws and tokens per second for one experiment of N seeds (a benchmark,
not a test).

Runs the same experiment (the lesson's herb prompt, temperature 1.0, 64 seeds x 8 tokens by default)
with mlxinfer.sample one seed at a time and batched at B = 8, 16, 32, 64, and mlx-lm's batch_generate
at the same B on the same weights (mlx-lm's own model class holding our tensors; its prompt cache
prefilled once and handed to every row, as ours is). Repeats are interleaved and figures are medians.
It also counts the seeds whose text equals the one-at-a-time run's.

    python bench/batched_sampling.py                           # embedded model, float32 path on a CPU
    python bench/batched_sampling.py --compute-dtype bfloat16 --seeds 32 --batches 8,32
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "Name one herb to add to tomato soup. Answer with one word."


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model source (default: the embedded SmolLM2-135M)")
    p.add_argument("--compute-dtype", default="auto")
    p.add_argument("--seeds", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--batches", default="8,16,32,64")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-mlx-lm", action="store_true", help="skip mlx-lm's batch_generate rows")
    a = p.parse_args()

    import mlxinfer  # first: the BLAS preload must run before mlx is imported

    import mlx.core as mx

    model, tok = mlxinfer.load(a.model, compute_dtype=a.compute_dtype)
    sizes = [int(b) for b in a.batches.split(",")]
    settings = {"temperature": 1.0}

    def ours(batch: int):
        def run():
            report = mlxinfer.sample(
                model, tok, PROMPT, seeds=a.seeds, settings=settings, max_tokens=a.max_tokens, batch_size=batch
            )
            return [c.tokens for c in report.completions]

        return run

    def theirs(batch: int, twin, ids, cache):
        from mlx_lm.generate import batch_generate
        from mlx_lm.sample_utils import make_sampler

        def run():
            caches = [mlxinfer.fork_cache(cache, 1) for _ in range(a.seeds)]
            mx.random.seed(0)
            out = batch_generate(
                twin,
                tok,
                [ids[-1:]] * a.seeds,
                prompt_caches=caches,
                max_tokens=a.max_tokens,
                return_token_ids=True,
                sampler=make_sampler(temp=1.0),
                completion_batch_size=batch,
                prefill_batch_size=min(batch, 8),
            )
            return out.token_ids

        return run

    engines = {"mlxinfer, one seed at a time": ours(1)}
    engines.update({f"mlxinfer, batched B={b}": ours(b) for b in sizes})
    if not a.no_mlx_lm:
        from mlx_lm.models.cache import make_prompt_cache

        twin = mlxinfer.mlx_lm_twin(model)
        ids = mlxinfer.encode_prompt(tok, PROMPT)
        cache = make_prompt_cache(twin)
        twin(mx.array(ids[:-1])[None], cache=cache)
        mx.eval([c.state for c in cache])
        engines.update({f"mlx-lm batch_generate, B={b}": theirs(b, twin, ids, cache) for b in sizes})

    for run in engines.values():  # warm-up: kernels for every batch shape
        run()
    times: dict[str, list[float]] = {name: [] for name in engines}
    tokens: dict[str, list[list[int]]] = {}
    for r in range(a.repeats):
        names = list(engines)
        names = names[r % len(names) :] + names[: r % len(names)]  # rotate who goes first
        for name in names:
            start = time.perf_counter()
            tokens[name] = engines[name]()
            times[name].append(time.perf_counter() - start)
            print(f"  {name}: {times[name][-1]:.2f} s", file=sys.stderr)

    base = tokens["mlxinfer, one seed at a time"]
    base_tps = sum(map(len, base)) / statistics.median(times["mlxinfer, one seed at a time"])
    print(f"model: {model.info.name}; weights {model.info.weights}; {mlxinfer.system_info()['blas']['library']}")
    print(f"{a.seeds} seeds x up to {a.max_tokens} tokens, temperature 1.0, medians of {a.repeats} interleaved runs\n")
    print("| engine | seconds | draws/s | tokens/s | x one at a time | same text as one at a time |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in engines:
        seconds = statistics.median(times[name])
        n_tokens = sum(map(len, tokens[name]))
        same = sum(x == y for x, y in zip(tokens[name], base)) if name.startswith("mlxinfer") else None
        print(
            f"| {name} | {seconds:.2f} | {a.seeds / seconds:.1f} | {n_tokens / seconds:.1f} | "
            f"{n_tokens / seconds / base_tps:.2f} | {'-' if same is None else f'{same}/{a.seeds}'} |"
        )


if __name__ == "__main__":
    main()
