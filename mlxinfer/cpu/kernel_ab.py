"""Two builds of the quantized matmul extension, side by side in one process, called in alternation.

On a shared machine a kernel change of 5% drowns in the noise between runs (decode medians moved from 97
to 125 tok/s within ten minutes on a 2-core VM). Loaded into one process and called turn about, the two
builds see the same drift, and the ratio of each pair keeps only their difference. Run it on an otherwise
idle machine: beside a parallel test run, two builds with the same compiled loop read 0.75x.

    git stash; python -m mlxinfer.cpu.qmm        # builds the old sources: note the folder it names
    git stash pop; python -m mlxinfer.cpu.qmm    # the new ones
    python -m mlxinfer.cpu.kernel_ab OLD_FOLDER NEW_FOLDER

Matmuls of the embedded model's shapes, one row or `--rows M` (4-bit layers, the 8-bit output table): each
build's median time, the median of the pairs' ratios and its interquartile range, and whether the two outputs are equal
bit for bit (a change of schedule must keep them). A developer's tool beside the kernel it measures (the
boundary keeps bench/ on the public API). For a whole decode, load the model once with each build (set
qmm._module before mlxinfer.load: a model keeps the module it was loaded with) and alternate its runs.
"""

from __future__ import annotations

import argparse
import glob
import statistics
import time

import mlx.core as mx

from . import qmm

SHAPES = [(49152, 576, 4), (49152, 576, 8), (3072, 576, 4), (960, 576, 4), (576, 1536, 4)]  # N, K, bits


def load(folder: str):
    found = glob.glob(f"{folder}/_mlxinfer_qmm*.so")
    if not found:
        raise SystemExit(f"no built extension in {folder}: build it with python -m mlxinfer.cpu.qmm")
    return qmm._import(found[0])


def timed(k, x, weight, bits: int, calls: int) -> float:
    """Seconds a call of build k's one-row matmul takes, `calls` of them in one graph."""
    outs = [k.quantized_matmul(x + i, *weight, 32, bits) for i in range(calls)]
    start = time.perf_counter()
    mx.eval(outs)
    return (time.perf_counter() - start) / calls


def matmuls(builds, pairs: int, rows: int = 1) -> None:
    for N, K, bits in SHAPES:
        w, s, b = mx.quantize(mx.random.normal((N, K)), group_size=32, bits=bits)
        s, b = s.astype(mx.float16), b.astype(mx.float16)
        x = mx.random.normal((rows, K))
        mx.eval(w, s, b, x)
        calls = max(1, 2 * 49152 // N // rows)  # one graph of several calls: the eval's own cost spread over them
        same = mx.array_equal(*(k.quantized_matmul(x, w, s, b, 32, bits) for k in builds)).item()
        for k in builds:
            timed(k, x, (w, s, b), bits, calls)
        times = [[], []]
        for _ in range(pairs):
            for i, k in enumerate(builds):
                times[i].append(timed(k, x, (w, s, b), bits, calls))
        ratios = sorted(a / b for a, b in zip(*times))
        q = len(ratios) // 4
        print(
            f"{rows} x {N:6d} x {K} {bits}-bit: A {statistics.median(times[0]) * 1e3:.3f} ms, B "
            f"{statistics.median(times[1]) * 1e3:.3f} ms; A/B {statistics.median(ratios):.2f} "
            f"(IQR {ratios[q]:.2f}-{ratios[-q - 1]:.2f}); same bits: {same}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", help="the folder of one build (A)")
    parser.add_argument("b", help="the folder of the other (B)")
    parser.add_argument("--pairs", type=int, default=15, help="alternating pairs of calls per shape")
    parser.add_argument("--rows", type=int, default=1, help="rows of x (1: decode; more: the several-row tiles)")
    args = parser.parse_args()
    if args.rows < 1:
        parser.error("--rows must be at least 1")
    if not qmm.available():
        raise SystemExit(f"the extension is not available here: {qmm.status()['reason']}")
    builds = [load(args.a), load(args.b)]
    matmuls(builds, args.pairs, args.rows)


if __name__ == "__main__":
    main()
