"""The fuzzer's small budget, run by `make test`: Hypothesis draws a fresh set of hostile cases of each
kind (GGUF headers, safetensors headers, config.json values, JSON Schemas, command-line values) on every
run, each runs as `python -m mlxinfer ...` in its own subprocess, and every one must keep the rule in
fuzz_runner.py. The seed is printed at the end of the run (and in a failure's message); replay one with
`MLXINFER_FUZZ_SEED=<seed> pytest tests/fuzz`. tests/fuzz/run_long.py runs the same strategies for
thousands of cases. The oracle itself is tested here too, on planted failures."""

from __future__ import annotations

import os
import random

import fuzz_runner
import pytest

# cases per kind: 5-15 s here on two shared cores (the subprocesses run two at a time)
PER_KIND = {"gguf": 6, "safetensors": 4, "config": 6, "schema": 4, "cli": 8}
SEED_ENV = "MLXINFER_FUZZ_SEED"


def fuzz_seed() -> int:
    """MLXINFER_FUZZ_SEED when set (a replay), else a new seed for this run."""
    given = os.environ.get(SEED_ENV, "").strip()
    return int(given) if given else random.SystemRandom().randrange(2**32)


@pytest.fixture(scope="module")
def bases(checkpoint_dir):
    return fuzz_runner.Bases.make(checkpoint_dir("llama"), checkpoint_dir("llama", 4, 64))


@pytest.mark.slow
def test_hostile_inputs_keep_the_rule(bases, tmp_path):
    seed = fuzz_seed()  # conftest drew it for this run (and prints it at the end)
    strategies = fuzz_runner.cases(bases)
    drawn = [(kind, case) for kind, n in PER_KIND.items() for case in fuzz_runner.draw(strategies[kind], n, seed)]
    assert len(drawn) == sum(PER_KIND.values())
    failures = [o for o in fuzz_runner.run_all(drawn, bases, tmp_path) if o.problem]
    assert not failures, f"replay: {SEED_ENV}={seed} pytest tests/fuzz\n" + "\n".join(
        f"{o.problem}\n  mlxinfer {' '.join(o.args)}" for o in failures
    )


def test_a_replayed_seed_draws_the_same_cases_and_another_seed_others(bases):
    strategies = fuzz_runner.cases(bases)
    for kind in ("config", "cli"):
        first, again = (fuzz_runner.draw(strategies[kind], 4, 12345) for _ in range(2))
        assert repr(first) == repr(again), kind
        others = [repr(fuzz_runner.draw(strategies[kind], 4, s)) for s in (1, 2, 3)]
        assert any(o != repr(first) for o in others), kind


# A planted program instead of mlxinfer, run through the same subprocess, time-out and judge.
PLANTED = {
    "traceback": ("import sys; print('partial output'); raise RuntimeError('planted')", 30, "traceback: RuntimeError"),
    "hang": ("import time; time.sleep(60)", 1, "hang: no exit within 1 s"),
    "bad exit code": ("import sys; sys.stderr.write('error: planted\\n'); sys.exit(3)", 30, "exit 3: error: planted"),
    "two error lines": ("import sys; sys.stderr.write('error: a\\nerror: b\\n'); sys.exit(2)", 30, "not one line"),
    "signal": ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", 30, "crash: killed by signal 11"),
    "NaN in --json": ("print('{\"x\": NaN}')", 30, "not strict JSON"),
    "a partial left behind": ("import os; os.mkdir('.out.partial-1-x'); print('{}')", 30, "left behind"),
}


@pytest.mark.parametrize("name", list(PLANTED))
def test_the_oracle_catches_a_planted_failure(name, tmp_path):
    code, timeout, problem = PLANTED[name]
    if name == "a partial left behind":
        code = code.replace(".out", str(tmp_path / ".out"))
    outcome = fuzz_runner.execute("cli", ["count", "x", "--json"], tmp_path, timeout=timeout, launch=code)
    assert outcome.problem is not None and outcome.problem.startswith(problem), outcome


def test_the_oracle_passes_what_keeps_the_rule(tmp_path):
    """The same path accepts one error line with exit 2, and strict JSON with exit 0: the checks above fail
    because of what was planted, not because of the harness."""
    for code in ("import sys; sys.stderr.write('error: bad input\\n'); sys.exit(2)", "print('{\"x\": 1}')"):
        outcome = fuzz_runner.execute("cli", ["count", "x", "--json"], tmp_path, timeout=30, launch=code)
        assert outcome.problem is None, outcome
