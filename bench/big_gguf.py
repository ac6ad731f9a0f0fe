"""A SmolLM2-1.7B-shaped GGUF (random weights, stored as the embedded model stores its own: Q4_1 matmuls,
a Q8_0 tied table, F32 norms) for decode against llama.cpp on a model 13x the embedded one's size.

The shape is SmolLM2-1.7B-Instruct's (Llama: 24 layers, hidden 2,048, MLP 8,192, 32 heads, 32 KV heads),
the family of the embedded model: the embedded file's metadata (its tokenizer, chat template, RoPE and
norm settings) is copied and only the shape changed, so both engines tokenize alike and read the same
bytes. The blocks are random (codes uniform, each block's scale and minimum drawn around ±0.02): a speed
model, not a language model. Written once into the cache (MLXINFER_CACHE, else ~/.cache/mlxinfer).

    python bench/big_gguf.py            # write it (about 1.1 GB, under a minute), print its path
    python bench/big_gguf.py --bench    # and `mlxinfer bench --model` it: ours, mlx-lm, llama.cpp
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import mlxinfer  # noqa: I001  (first: it loads the fast BLAS the float32 path needs before mlx is imported)
import numpy as np

SHAPE = {  # SmolLM2-1.7B-Instruct's config.json, in llama.cpp's keys
    "block_count": 24,
    "embedding_length": 2048,
    "feed_forward_length": 8192,
    "attention.head_count": 32,
    "attention.head_count_kv": 32,
    "rope.dimension_count": 64,
}
BLOCK = 32  # values a Q4_1 / Q8_0 block holds


def q4_1(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """(rows, cols) as Q4_1 blocks: f16 scale d, f16 minimum m, 16 bytes of codes; value = d q + m."""
    n = rows * cols // BLOCK
    d = rng.uniform(0.002, 0.003, n).astype(np.float16)
    m = (-8 * d.astype(np.float32) * rng.uniform(0.9, 1.1, n)).astype(np.float16)
    codes = rng.integers(0, 256, (n, 16), dtype=np.uint8)
    blocks = np.concatenate([d.view(np.uint8).reshape(n, 2), m.view(np.uint8).reshape(n, 2), codes], axis=1)
    return blocks.reshape(rows, cols // BLOCK * 20)


def q8_0(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """(rows, cols) as Q8_0 blocks: f16 scale d, 32 signed codes; value = d q."""
    n = rows * cols // BLOCK
    d = rng.uniform(1e-4, 2e-4, n).astype(np.float16)
    codes = rng.integers(-127, 128, (n, BLOCK), dtype=np.int8)
    return np.concatenate([d.view(np.uint8).reshape(n, 2), codes.view(np.uint8)], axis=1).reshape(rows, -1)


def write(out: Path) -> Path:
    import gguf

    src = gguf.GGUFReader(str(mlxinfer.embedded_model_path()))
    arch = src.fields["general.architecture"].contents()
    assert arch == "llama", arch
    part = out.with_suffix(".part")
    w = gguf.GGUFWriter(str(part), arch)
    for field in src.fields.values():
        key = field.name.removeprefix(f"{arch}.")
        if field.name.startswith("GGUF.") or field.name == "general.architecture" or key in SHAPE:
            continue
        if field.name in ("general.name", "general.size_label"):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    w.add_name("SmolLM2-1.7B-shaped random Q4_1")
    for key, value in SHAPE.items():
        w.add_uint32(f"{arch}.{key}", value)
    D, F, L = SHAPE["embedding_length"], SHAPE["feed_forward_length"], SHAPE["block_count"]
    V = int(src.fields[f"{arch}.vocab_size"].contents())
    rng = np.random.default_rng(0)
    Q4, Q8 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0
    w.add_tensor("token_embd.weight", q8_0(rng, V, D), raw_dtype=Q8)
    w.add_tensor("output_norm.weight", np.ones(D, np.float32))
    for i in range(L):
        for name, (rows, cols) in {
            "attn_q": (D, D), "attn_k": (D, D), "attn_v": (D, D), "attn_output": (D, D),
            "ffn_gate": (F, D), "ffn_up": (F, D), "ffn_down": (D, F),
        }.items():  # fmt: skip
            w.add_tensor(f"blk.{i}.{name}.weight", q4_1(rng, rows, cols), raw_dtype=Q4)
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(D, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(D, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(part, out)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bench", action="store_true", help="then run `mlxinfer bench --model` on it")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gen-tokens", type=int, default=32)
    args = parser.parse_args()
    cache = Path(os.environ.get("MLXINFER_CACHE") or Path.home() / ".cache" / "mlxinfer")
    path = cache / "bench" / "smollm2-1.7b-shaped-q4_1.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write(path)
    print(path, flush=True)
    if not args.bench:
        return 0
    cli = Path(sys.executable).with_name("mlxinfer")
    command = [str(cli), "bench", "--model", str(path), "--prompt-tokens", "16", "--no-fast",
               "--gen-tokens", str(args.gen_tokens), "--repeats", str(args.repeats)]  # fmt: skip
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
