"""Start-up of the commands a user runs first: `count` and `topk` on the embedded model, wall clock
and CPU, each compute dtype side by side (a benchmark, not a test).

`topk` loads the model and its tokenizer, renders the chat template and runs one forward pass, so
its time is start-up plus one prefill. The goal (issue 22): `topk` <= 1.2 s wall on a 2-core
machine. CPU time moves less than wall time when other work shares the machine.

    python bench/startup.py                  # 5 runs each, medians
    python bench/startup.py --runs 9 --repo /path/to/another/checkout   # e.g. the tree before a change
    python bench/startup.py --stages         # and topk's start-up stage by stage, in one process
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 1.2
PROMPT = "Name one fruit. Answer with one word."
DTYPES = ("auto", "float32", "bfloat16")

# an installed package has .pyc files; without them every run recompiles our modules
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str], repo: Path, runs: int) -> tuple[float, float, str]:
    """Median wall and CPU (user + system) seconds of `cmd` over `runs` runs after one warm-up run
    (fills the OS and .pyc caches), and its stdout (the same every run, or an error)."""
    env = {**ENV, "PYTHONPATH": str(repo)}
    first = subprocess.run(cmd, cwd=repo, check=True, capture_output=True, env=env, text=True)
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        out = subprocess.run(cmd, cwd=repo, check=True, capture_output=True, env=env, text=True)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if out.stdout != first.stdout:
            raise RuntimeError(f"{' '.join(cmd)} printed something else on a later run")
    return statistics.median(walls), statistics.median(cpus), first.stdout


# one process, the start-up of `topk` in stages (what each costs without the others' noise)
STAGES = """
import json, sys, time
t = [time.perf_counter()]
def mark(): t.append(time.perf_counter())
import mlxinfer
from mlxinfer.formats import gguf, sources
from mlxinfer.tokenizer import encode_prompt
from mlxinfer.tokenizer_load import tokenizer_from_gguf
mark()
header = gguf.read_header(sources.embedded_model_path()); mark()
tokenizer = tokenizer_from_gguf(header); mark()
ids = encode_prompt(tokenizer, sys.argv[1]); mark()
model, _ = mlxinfer.load(compute_dtype=sys.argv[2]); mark()
mlxinfer.next_token_table(model, tokenizer, sys.argv[1]); mark()
names = ["import mlxinfer", "read the GGUF header", "build the tokenizer", "chat template + encode",
         "load (header, weights, tokenizer again, compute path)", "next_token_table (one forward pass)"]
print(json.dumps({n: b - a for n, a, b in zip(names, t, t[1:])}))
"""


def stages(repo: Path, prompt: str, dtype: str, runs: int) -> dict[str, float]:
    """Median seconds of each stage of STAGES over `runs` runs."""
    env = {**ENV, "PYTHONPATH": str(repo)}
    cmd = [sys.executable, "-c", STAGES, prompt, dtype]
    subprocess.run(cmd, cwd=repo, check=True, capture_output=True, env=env)
    results = [
        json.loads(subprocess.run(cmd, cwd=repo, check=True, capture_output=True, env=env).stdout) for _ in range(runs)
    ]
    return {k: statistics.median(r[k] for r in results) for k in results[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--repo", type=Path, default=REPO, help="the checkout to time (default: this one)")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--stages", action="store_true", help="also time topk's start-up stage by stage, in one process")
    args = ap.parse_args()

    py, repo = sys.executable, args.repo.resolve()
    app = [py, "-m", "mlxinfer_cli.app"]
    rows = [
        ("python -c pass", [py, "-c", "pass"]),
        ("mlxinfer count", [*app, "count"]),
        *(
            (f"mlxinfer topk --compute-dtype {d}", [*app, "topk", "-p", args.prompt, "--compute-dtype", d])
            for d in DTYPES
        ),
        ("for scale: import mlx_lm", [py, "-c", "import mlx_lm"]),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"{repo}: median of {args.runs} runs, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'':<{width}}  {'wall':>7}  {'cpu':>7}")
    for name, cmd in rows:
        try:
            wall, cpu, _ = timed(cmd, repo, args.runs)
        except (subprocess.CalledProcessError, RuntimeError) as e:
            detail = e.stderr.strip()[-200:] if isinstance(e, subprocess.CalledProcessError) else str(e)
            print(f"{name:<{width}}  failed: {detail}")
            continue
        note = ""
        if "topk" in name:
            note = "   ok" if wall <= GOAL_S else f"   over the {GOAL_S} s goal"
        print(f"{name:<{width}}  {wall:6.3f}s  {cpu:6.3f}s{note}")

    if args.stages:
        for dtype in DTYPES:
            print(f"\nstages of topk --compute-dtype {dtype} (median of {args.runs}, one process each)")
            for name, seconds in stages(repo, args.prompt, dtype, args.runs).items():
                print(f"  {name:<55} {seconds:6.3f}s")


if __name__ == "__main__":
    main()
