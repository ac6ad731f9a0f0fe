"""The fuzzer's long budget: thousands of Hypothesis-drawn hostile cases, and a report of what they found.

    python tests/fuzz/run_long.py --cases 2000 --seed 1 --out fuzz-out

Run from the repository root (the worktree's mlxinfer is the one tested). Writes OUT/report.md
(cases tried per kind, exit codes, failures grouped by problem, slowest cases), OUT/failures.jsonl
(one line per failing case: its kind, the drawn case, the command line, stderr) and keeps each failing
case's files under OUT/cases/ so that it can be replayed by hand. Exit code 1 if any case failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent), str(HERE.parents[1])]

import mlxinfer  # noqa: E402,F401  (first: it loads a fast BLAS before anything imports mlx)
import checkpoints  # noqa: E402
import fuzz_runner  # noqa: E402

KINDS = {"gguf": 0.25, "safetensors": 0.15, "config": 0.2, "schema": 0.15, "cli": 0.25}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--out", type=Path, default=Path("fuzz-out"))
    a = parser.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="mlxinfer-fuzz-"))
    try:
        llama = checkpoints.write_checkpoint(scratch / "llama", "llama")
        bases = fuzz_runner.Bases.make(llama, checkpoints.quantized_copy(llama, scratch / "llama-4bit", 4, 64))
        strategies = fuzz_runner.cases(bases)
        drawn = []
        for i, (kind, share) in enumerate(KINDS.items()):
            drawn += [(kind, c) for c in fuzz_runner.draw(strategies[kind], round(a.cases * share), a.seed + i)]
        print(f"{len(drawn)} cases, seed {a.seed}, {a.workers} at a time", flush=True)
        outcomes, start = [], time.monotonic()
        with open(a.out / "failures.jsonl", "w") as log:
            for n, o in enumerate(fuzz_runner.run_all(drawn, bases, scratch / "cases", a.workers, a.timeout), 1):
                outcomes.append(o)
                if o.problem:
                    case = drawn[n - 1][1]
                    record = {"kind": o.kind, "problem": o.problem, "args": o.args, "case": repr(case)}
                    log.write(json.dumps({**record, "stderr": o.stderr[-3000:]}) + "\n")
                    log.flush()
                    work = scratch / "cases" / f"{n - 1:05d}-{o.kind}"
                    if work.exists():
                        shutil.copytree(work, a.out / "cases" / work.name, dirs_exist_ok=True)
                    print(f"FAIL {n}: {o.problem}\n  mlxinfer {' '.join(o.args)[:300]}", flush=True)
                if n % 100 == 0:
                    print(f"{n} cases, {time.monotonic() - start:.0f} s", flush=True)
        (a.out / "report.md").write_text(report(outcomes, a.seed, time.monotonic() - start))
        print((a.out / "report.md").read_text())
        return 1 if any(o.problem for o in outcomes) else 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def report(outcomes, seed: int, seconds: float) -> str:
    failed = [o for o in outcomes if o.problem]
    lines = [
        "# mlxinfer fuzz run",
        "",
        f"{len(outcomes):,} cases (seed {seed}) in {seconds / 60:.1f} minutes; {len(failed)} failed.",
        "",
        "| kind | cases | exit 0 | exit 1 (cut JSON) | exit 2 (one-line error) | failed |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind in KINDS:
        mine = [o for o in outcomes if o.kind == kind]
        codes = Counter(o.returncode for o in mine if not o.problem)
        lines.append(
            f"| {kind} | {len(mine)} | {codes[0]} | {codes[1]} | {codes[2]} | {sum(1 for o in mine if o.problem)} |"
        )
    if failed:
        lines += ["", "## Failures", ""]
        for problem, n in Counter(o.problem.split(":")[0] for o in failed).most_common():
            lines.append(f"- {problem}: {n}")
        for o in failed[:50]:
            lines.append(f"  - `{o.problem[:160]}`: `mlxinfer {' '.join(o.args)[:200]}`")
    errors = Counter(o.stderr.strip().split(";")[0][:90] for o in outcomes if o.returncode == 2 and not o.problem)
    lines += ["", "## The most common one-line errors", ""]
    lines += [f"- {n} x `{e}`" for e, n in errors.most_common(15)]
    slow = sorted(outcomes, key=lambda o: -o.seconds)[:5]
    lines += ["", "## Slowest cases", ""] + [f"- {o.seconds:.1f} s: `mlxinfer {' '.join(o.args)[:160]}`" for o in slow]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
