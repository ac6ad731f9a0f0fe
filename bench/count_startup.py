"""How long `mlxinfer count` takes, beside a bare `python -c pass` (a benchmark, not a test).

`count` reads config.json and file headers in plain Python; it never imports mlx, mlx-lm or
transformers. The goal: under 0.3 s on top of starting Python at all.

    python bench/count_startup.py            # 7 runs each, medians
    python bench/count_startup.py --runs 15 tests/fixtures/configs/qwen3-0.6b.json
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL_S = 0.3


# an installed package has .pyc files; without them every run recompiles our modules
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(cmd: list[str], runs: int) -> tuple[float, float]:
    """Median wall time and median CPU time (user + system) of `cmd` over `runs` runs, after one warm-up
    run (fills the OS and .pyc caches). CPU time barely moves when other work shares the machine."""
    subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, env=ENV)
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=REPO, check=True, capture_output=True, env=ENV)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default="tests/fixtures/configs/llama-3.1-8b.json")
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()

    py = sys.executable
    rows = [
        ("python -c pass", [py, "-c", "pass"]),
        # what any typer command with options pays here: typer 0.29 coerces options through pydantic
        ("for scale: import typer, pydantic", [py, "-c", "import typer, pydantic"]),
        # the API alone: the counting itself, without the CLI framework
        ("API: count(model) in python -c", [py, "-c", f"import mlxinfer; mlxinfer.count({args.model!r})"]),
        (f"mlxinfer count {args.model}", [py, "-m", "mlxinfer", "count", args.model]),
        (f"mlxinfer count {args.model} --json", [py, "-m", "mlxinfer", "count", args.model, "--json"]),
        ("mlxinfer count (embedded GGUF, 98 MB)", [py, "-m", "mlxinfer", "count"]),
        ("for scale: python -c 'import mlx_lm'", [py, "-c", "import mlx_lm"]),
    ]
    base = None
    width = max(len(name) for name, _ in rows)
    print(f"median of {args.runs} runs, {py}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'':<{width}}  {'wall':>7}  {'cpu':>7}  wall over python -c pass")
    for name, cmd in rows:
        try:
            wall, cpu = timed(cmd, args.runs)
        except subprocess.CalledProcessError as e:
            print(f"{name:<{width}}  failed (exit {e.returncode}): {e.stderr.decode().strip()[-200:]}")
            continue
        base = wall if base is None else base
        extra = "" if wall is base else f"+{wall - base:.3f} s"
        if name.startswith("mlxinfer count"):
            extra += "   ok" if wall - base < GOAL_S else f"   over the {GOAL_S} s goal"
        print(f"{name:<{width}}  {wall:6.3f}s  {cpu:6.3f}s  {extra}")


if __name__ == "__main__":
    main()
