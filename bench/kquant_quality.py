"""What keeping a K-quant GGUF in MLX costs: the embedded SmolLM2 re-quantized to K-quant and i-quant files
the way llama.cpp's quantizer lays them out, each loaded as mlxinfer keeps it against the same file read
as the gguf package's float32 values (`FILE.gguf@float32`), with `quant.evaluate` (KL, top-1, perplexity).

SmolLM2's hidden size (576) is no multiple of 256, so, as llama.cpp does for such rows, only ffn_down
(1,536 inputs) takes the K-quant or IQ4_XS; the 576-input matrices take llama.cpp's fallback (Q5_0 for
Q4_K, Q5_1 for Q5_K, Q8_0 for Q6_K, IQ4_NL for the others), the tied table Q8_0. The blocks come from
tests/ggml_blocks.py (min/max scales, not llama.cpp's search): the files are valid, not llama.cpp's best.

    python bench/kquant_quality.py                     # every file, the shipped text, windows of 512
    python bench/kquant_quality.py --max-tokens 600    # a quicker look
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import mlxinfer  # noqa: E402  (first: it loads a fast BLAS before anything imports mlx)

# name -> (ffn_down's type, the 576-input matrices' type, general.file_type)
FILES = {
    "Q4_K_M": ("Q4_K+Q6_K", "Q5_0", 15),  # ffn_down Q6_K in llama.cpp's "more bits" layers, Q4_K in the rest
    "Q5_K_M": ("Q5_K+Q6_K", "Q5_1", 17),
    "Q6_K": ("Q6_K", "Q8_0", 18),
    "Q3_K_M": ("Q3_K", "IQ4_NL", 12),
    "Q2_K": ("Q2_K", "IQ4_NL", 10),
    "IQ4_XS": ("IQ4_XS", "IQ4_NL", 30),
}


def more_bits(layer: int, n_layers: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between."""
    return layer < n_layers // 8 or layer >= 7 * n_layers // 8 or (layer - n_layers // 8) % 3 == 2


def write(name: str, out: Path) -> Path:
    """The embedded GGUF re-quantized as FILES[name] says, its metadata copied."""
    import ggml_blocks
    import gguf
    import numpy as np

    down, other, file_type = FILES[name]
    embedded, _ = mlxinfer.load(None, compute_dtype="bfloat16")
    src = gguf.GGUFReader(str(embedded.info.source.path))
    arch = src.fields["general.architecture"].contents()
    n_layers = src.fields[f"{arch}.block_count"].contents()
    w = gguf.GGUFWriter(str(out), arch)
    for field in src.fields.values():
        if field.name.startswith("GGUF.") or field.name in ("general.architecture", "general.file_type"):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    w.add_file_type(file_type)
    for t in src.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed([int(d) for d in t.shape])))
        if values.ndim == 1:
            w.add_tensor(t.name, values.astype(np.float32))
            continue
        if t.name == "token_embd.weight":
            kind = "Q8_0"
        elif ".ffn_down." in t.name:
            layer = int(t.name.split(".")[1])
            kind = down.split("+")[int(more_bits(layer, n_layers))] if "+" in down else down
        else:
            kind = other
        w.add_tensor(t.name, ggml_blocks.quantize(values, kind), raw_dtype=gguf.GGMLQuantizationType[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", default=",".join(FILES), help="which of " + ", ".join(FILES))
    parser.add_argument("--max-tokens", type=int, default=None)
    parser.add_argument("--window", type=int, default=512)
    args = parser.parse_args()

    from mlxinfer_quant import evaluate

    print("| file | types | bits/weight (file) | mean KL (nats) | max KL | top-1 | perplexity (reference) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.files.split(","):
            path = write(name, Path(tmp) / f"smol-{name}.gguf")
            r = evaluate(f"{path}@float32", [path], max_tokens=args.max_tokens, window=args.window)
            c = r.candidates[0]
            types = mlxinfer.count(path).quantization["types"]
            mix = ", ".join(f"{k} x{d['tensors']}" for k, d in types.items() if k != "F32")
            print(
                f"| {name} | {mix} | {c.bits_per_weight:.2f} | {c.kl_mean:.2e} | {c.kl_max:.2e} "
                f"| {c.top1_agreement:.1%} | {c.perplexity:.3f} ({r.reference.perplexity:.3f}) |",
                flush=True,
            )


if __name__ == "__main__":
    main()
