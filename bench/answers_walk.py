"""The exact answers' walk against its alternatives, measured side by side in one run.

    python bench/answers_walk.py                    # the embedded model, the herb prompt
    python bench/answers_walk.py --compute-dtype int8

1. Batched expansion: the same walk (T = 1, top-k 10, 4 tokens, a fixed number of paths) with the walk's
   default batch (--batch-size, 64 paths a forward pass) against one path per pass, interleaved --repeats
   times: paths expanded per second (medians), and the ratio: the median of each run's pair (a pair runs
   back to back, so a drift of the machine's speed between runs falls on both of its sides).
2. Exact against sampling: the whole walk at T = 1 with top-k 10 and 4 tokens (a finite support of at most
   10^4 answers, walked to remainder 0) against `sample --seeds 1000` with the same settings; 1,000 draws
   know a p = 0.5 answer only to about +-0.03 (two standard errors: 2 sqrt(0.25 / 1000)).
3. What the walk reaches at T = 0.5 with nothing cut in the time those 1,000 draws took.
4. Peak memory at 10,000 paths expanded, and what the paths keep (their last token's keys and values).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import mlxinfer
from mlxinfer import defaults

HERB = "Name one herb to add to tomato soup. Answer with one word."
CUT = {"temperature": 1.0, "top_k": 10}


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--compute-dtype", default="auto")
    parser.add_argument("--nodes", type=int, default=256, help="paths expanded in the batched-against-one comparison")
    parser.add_argument("--batch-size", type=int, default=defaults.ANSWERS_BATCH_SIZE, help="paths a batched pass")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of the comparison (medians)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    if args.batch_size < 2:
        parser.error("--batch-size must be at least 2 (it is compared with one path a pass)")
    model, tok = mlxinfer.load(args.model, compute_dtype=args.compute_dtype)
    out = {"model": model.info.name, "compute_dtype": model.info.compute_dtype}

    def walk(**kw):
        return mlxinfer.answers(model, tok, HERB, max_tokens=4, **kw)

    walk(settings=[CUT], max_nodes=8)  # warm: the kernels and the prompt's first pass
    batch = args.batch_size
    rates = {batch: [], 1: []}
    for _ in range(args.repeats):  # interleaved, so that a slow spell of the machine falls on both
        for size in (batch, 1):
            report, seconds = timed(
                lambda s=size: walk(settings=[CUT], max_nodes=args.nodes, min_mass=1.0, batch_size=s)
            )
            rates[size].append(report.nodes / seconds)
    median = {size: statistics.median(r) for size, r in rates.items()}
    ratios = [a / b for a, b in zip(rates[batch], rates[1])]
    out["batched"] = {
        "batch_size": batch, "paths_per_s_batched": median[batch], "paths_per_s_1": median[1],
        "ratios": ratios, "ratio": statistics.median(ratios), "ratio_of_medians": median[batch] / median[1],
    }  # fmt: skip

    complete, walk_s = timed(lambda: walk(settings=[CUT], min_mass=1.0, max_nodes=20_000))
    _, sample_s = timed(lambda: mlxinfer.sample(model, tok, HERB, seeds=1000, settings=CUT, max_tokens=4))
    out["exact_vs_sampling"] = {
        "walk_seconds": walk_s,
        "walk_stopped": complete.stopped,
        "walk_remainder": complete.mass[0].remainder,
        "walk_paths": complete.nodes,
        "answers": len(complete.answers),
        "sample_1000_seconds": sample_s,
        "ratio": sample_s / walk_s,
    }
    cold = walk(settings=[{"temperature": 0.5}], min_mass=1.0, max_nodes=10**9, max_seconds=sample_s)
    out["t05_in_that_time"] = {"explored": cold.mass[0].explored, "paths": cold.nodes, "stopped": cold.stopped}
    big = walk(settings=[{"temperature": 0.5}], min_mass=1.0, max_nodes=10_000)
    out["ten_thousand_paths"] = {
        "paths": big.nodes,
        "explored": big.mass[0].explored,
        "kv_bytes_per_path": big.kv_bytes_per_node,
        "kv_bytes": big.kv_bytes,
        "peak_memory_bytes": big.peak_memory_bytes,
        "seconds": big.seconds,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    b, e, c, t = out["batched"], out["exact_vs_sampling"], out["t05_in_that_time"], out["ten_thousand_paths"]
    print(f"{out['model']} ({out['compute_dtype']}), {HERB!r}")
    print(
        f"1. paths per second (medians of {args.repeats} interleaved runs): {b['paths_per_s_batched']:.1f} batched ("
        f"{b['batch_size']} a pass) vs {b['paths_per_s_1']:.1f} one a pass; {b['ratio']:.1f}x, the median of the"
        f" runs' pairs ({', '.join(f'{r:.1f}x' for r in b['ratios'])}; the medians' ratio {b['ratio_of_medians']:.1f}x)"
    )
    print(
        f"2. T=1 top-k 10, 4 tokens: the whole walk ({e['walk_paths']:,} paths, {e['answers']:,} answers, "
        f"remainder {e['walk_remainder']}) in {e['walk_seconds']:.1f} s; sample --seeds 1000 in "
        f"{e['sample_1000_seconds']:.1f} s: exact is {e['ratio']:.1f}x faster"
    )
    print(
        f"3. T=0.5, nothing cut, in {e['sample_1000_seconds']:.1f} s: {c['explored']:.4f} of the mass resolved "
        f"({c['paths']:,} paths)"
    )
    print(
        f"4. {t['paths']:,} paths: keys and values kept {t['kv_bytes'] / 1e6:,.0f} MB "
        f"({t['kv_bytes_per_path'] / 1e3:.1f} KB a path), peak memory {t['peak_memory_bytes'] / 1e6:,.0f} MB, "
        f"explored {t['explored']:.4f}, {t['seconds']:.0f} s"
    )


if __name__ == "__main__":
    main()
