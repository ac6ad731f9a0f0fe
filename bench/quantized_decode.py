"""Decode and prefill speed of the compute paths, side by side, and the quantized path against its roofline.

  python bench/quantized_decode.py                  # embedded model, then a Qwen3-1.7B-shaped 4-bit model
  python bench/quantized_decode.py --skip-1p7b      # the embedded model only
  python bench/quantized_decode.py --nodes          # nodes in one decode step's graph, per path

Part 1, the embedded SmolLM2-135M (Q4_1 GGUF): a 64-token prompt, greedy decode, for the paths
"bfloat16" (as stored: MLX's own quantized kernels), "float32" (dequantized, BLAS) and "quantized"
(packed weights, cpu/qmm.py's kernel). Repeats are interleaved (the path order rotates) so machine
noise hits every path alike; each figure is the best over repeats, the median beside it. Peak memory
is MLX's peak while the path runs (its weights included, the other paths' models held meanwhile not).

Part 2, mlx-lm's qwen3 class with Qwen3-1.7B's config, random weights quantized to 4 bits (groups of
64, as mlx-community's Qwen3-1.7B-4bit), also written out and loaded as mlxinfer's own Qwen3 (whose
quantized path has the fused layers; --no-ours skips it): decode tok/s of the as-stored and quantized paths (and, with
--float32, the float32 path: 8 GB) beside the roofline = measured copy bandwidth / bytes the step reads (packed
weights, scales and biases of every matmul, the tied output table included).
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlxinfer  # noqa: I001  (first: it loads the fast BLAS the float32 path needs before mlx is imported)
import mlx.core as mx
import numpy as np


PATHS = ("bfloat16", "float32", "quantized")
QWEN3_1P7B = {
    "model_type": "qwen3",
    "hidden_size": 2048,
    "num_hidden_layers": 28,
    "intermediate_size": 6144,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "rms_norm_eps": 1e-6,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}


def run_once(model, ids: list[int], gen: int) -> tuple[float, float, list[int]]:
    """(prefill tok/s, decode tok/s, tokens): the prompt in one pass, then `gen` greedy steps."""
    if hasattr(model, "make_cache"):
        cache = model.make_cache()
    else:  # an mlx-lm class without one
        from mlx_lm.models.cache import make_prompt_cache

        cache = make_prompt_cache(model)
    t0 = time.perf_counter()
    logits = model(mx.array([ids]), cache)[:, -1, :]
    token = mx.argmax(logits, axis=-1)
    mx.eval(token)
    t1 = time.perf_counter()
    out = [token.item()]
    for _ in range(gen):
        token = mx.argmax(model(token[None], cache)[:, -1, :], axis=-1)
        mx.async_eval(token)
        out.append(token.item())
    t2 = time.perf_counter()
    return len(ids) / (t1 - t0), gen / (t2 - t1), out


def weight_bytes(model) -> int:
    from mlx.utils import tree_flatten

    return sum(p.nbytes for _, p in tree_flatten(model.parameters()))


def embedded(args) -> None:
    models = {p: mlxinfer.load(None, compute_dtype=p) for p in PATHS}
    tok = models["quantized"][1]
    ids = (tok.encode(" ".join(["The harbor town wakes slowly in winter."] * 20)))[: args.prompt_tokens]
    runs = {p: [] for p in PATHS}
    peaks = {p: 0 for p in PATHS}
    for r in range(args.repeats):
        order = PATHS[r % 3 :] + PATHS[: r % 3]
        for p in order:
            model = models[p][0]
            others = mx.get_active_memory() - weight_bytes(model)  # the other paths' models, held meanwhile
            mx.reset_peak_memory()
            runs[p].append(run_once(model, ids, args.gen_tokens))
            peaks[p] = max(peaks[p], mx.get_peak_memory() - others)
    same = {p: runs[p][0][2] == runs["float32"][0][2] for p in PATHS}
    print(f"embedded model ({models['quantized'][0].info.name}), prompt {len(ids)} tokens, {args.gen_tokens} decoded")
    print(f"{'path':<11} {'prefill tok/s':>14} {'decode tok/s':>13} {'weights MB':>11} {'peak MB':>8}  tokens")
    for p in PATHS:
        pre = [x[0] for x in runs[p]]
        dec = [x[1] for x in runs[p]]
        print(
            f"{p:<11} {max(pre):>7.1f} ({statistics.median(pre):>5.1f})"
            f" {max(dec):>6.1f} ({statistics.median(dec):>4.1f})"
            f" {weight_bytes(models[p][0]) / 1e6:>11.0f} {peaks[p] / 1e6:>8.0f}  "
            f"{'= float32' if same[p] else 'differ from float32'}"
        )
    print("(best over repeats, median in brackets; 'bfloat16' is the as-stored path)")


def count_nodes() -> None:
    """Primitives in one decode step's graph (after a 64-token prompt), per path, and the step's eval time."""
    import collections
    import io
    import re

    for p in PATHS[1:]:
        model = mlxinfer.load(None, compute_dtype=p)[0]
        cache = model.make_cache()
        mx.eval(model(mx.array([list(range(100, 164))]), cache))
        x, best = mx.array([[163]]), float("inf")
        for _ in range(20):
            t = time.perf_counter()
            mx.eval(model(x, cache))
            best = min(best, time.perf_counter() - t)
        dot = io.StringIO()
        mx.export_to_dot(dot, model(x, cache))
        names = collections.Counter(re.findall(r'label ="?([A-Za-z_0-9]+)', dot.getvalue()))
        top = ", ".join(f"{k} {v}" for k, v in names.most_common(8))
        print(f"{p:<10} {sum(names.values()):,} nodes a decode step, {best * 1e3:.1f} ms (best of 20): {top}")


def copy_bandwidth() -> float:
    """Bytes per second moved (read + write) by a 512 MB numpy copy, best of 5."""
    a = np.ones(128 * 2**20, np.float32)
    b = np.empty_like(a)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t)
    return 2 * a.nbytes / best


def step_bytes(model) -> int:
    """What one decode step reads: every quantized matmul's packed weight, scales and biases."""
    total = 0
    for _, m in model.named_modules():
        if mlxinfer.is_quantized(m):
            total += sum(m[k].nbytes for k in ("weight", "scales", "biases") if k in m)
    return total


def write_small_tokenizer(directory: str) -> None:
    """A byte-level BPE of a few hundred tokens (well inside the model's vocabulary) and its config."""
    import json

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok.train_from_iterator(["The harbor town wakes slowly in winter."] * 4, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet))  # fmt: skip
    tok.save(f"{directory}/tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>"}
    with open(f"{directory}/tokenizer_config.json", "w") as f:
        json.dump(config, f)


def qwen3_1p7b(args) -> None:
    import mlx.nn as nn
    from mlx_lm.models import qwen3

    bandwidth = copy_bandwidth()
    mx.random.seed(0)
    model = qwen3.Model(qwen3.ModelArgs(**QWEN3_1P7B))
    nn.quantize(model, group_size=64, bits=4)
    mx.eval(model.parameters())
    model.info = mlxinfer.ModelInfo.unnamed("mlx-lm qwen3")
    paths = ["bfloat16", "quantized", "float32"] if args.float32 else ["bfloat16", "quantized"]
    ids = list(range(1000, 1000 + 16))
    print("\nQwen3-1.7B-shaped random 4-bit (group 64), mlx-lm's qwen3 class")
    print(f"copy bandwidth {bandwidth / 1e9:.1f} GB/s")
    ours = None
    if not args.no_ours:  # the same weights written out and loaded as mlxinfer's own Qwen3 (fused layers)
        import tempfile

        from mlx_lm.utils import save_config, save_model

        tmp = tempfile.TemporaryDirectory(prefix="qwen3-1p7b-")
        save_model(tmp.name, model)
        save_config({**QWEN3_1P7B, "quantization": {"group_size": 64, "bits": 4}}, f"{tmp.name}/config.json")
        write_small_tokenizer(tmp.name)  # the loader wants one; decode speed does not depend on it
        ours = mlxinfer.load(tmp.name, compute_dtype="quantized")[0]
        best = max(run_once(ours, ids, args.gen_1p7b)[1] for _ in range(args.repeats))
        nbytes = step_bytes(ours)
        roof = bandwidth / nbytes
        print(
            f"quantized, mlxinfer's model decode {best:6.2f} tok/s; reads {nbytes / 1e9:.2f} GB a step; "
            f"roofline {roof:.1f} tok/s; {best / roof:.0%} of it"
        )
        del ours
        tmp.cleanup()
    for p in paths:
        mlxinfer.apply_compute_dtype(model, p)
        nbytes = (
            step_bytes(model)
            if p != "float32"
            else 4 * sum(m.weight.size for _, m in model.named_modules() if isinstance(m, nn.Linear))
            + 4 * model.model.embed_tokens.weight.size
        )
        slow = p == "bfloat16"  # MLX's CPU quantized matmul: one short run is enough to see it
        best = max(run_once(model, ids, 4 if slow else args.gen_1p7b)[1] for _ in range(1 if slow else args.repeats))
        roof = bandwidth / nbytes
        print(
            f"{p:<10} decode {best:6.2f} tok/s; reads {nbytes / 1e9:.2f} GB a step; roofline {roof:.1f} tok/s; "
            f"{best / roof:.0%} of it"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--gen-1p7b", type=int, default=16)
    ap.add_argument("--skip-1p7b", action="store_true")
    ap.add_argument("--float32", action="store_true", help="also the 1.7B float32 path (needs ~8 GB)")
    ap.add_argument("--no-ours", action="store_true", help="skip the 1.7B weights loaded as mlxinfer's own model")
    ap.add_argument("--nodes", action="store_true", help="only count one decode step's graph nodes per path")
    args = ap.parse_args()
    if args.nodes:
        return count_nodes()
    embedded(args)
    if not args.skip_1p7b:
        qwen3_1p7b(args)


if __name__ == "__main__":
    main()
