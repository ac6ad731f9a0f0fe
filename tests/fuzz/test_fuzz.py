"""The fuzzer's small budget, run by `make test`: Hypothesis draws a fixed set of hostile cases of each
kind (GGUF headers, safetensors headers, config.json values, JSON Schemas, command-line values), each
runs as `python -m mlxinfer ...` in its own subprocess, and every one must keep the rule in
fuzz_runner.py. tests/fuzz/run_long.py runs the same strategies for thousands of cases."""

from __future__ import annotations

import fuzz_runner
import pytest

# cases per kind: 5-15 s here on two shared cores (the subprocesses run two at a time)
PER_KIND = {"gguf": 6, "safetensors": 4, "config": 6, "schema": 4, "cli": 8}
SEED = 17  # fixed: `make test` runs the same cases every time; the long run draws new ones


@pytest.fixture(scope="module")
def bases(checkpoint_dir):
    return fuzz_runner.Bases.make(checkpoint_dir("llama"), checkpoint_dir("llama", 4, 64))


def test_hostile_inputs_keep_the_rule(bases, tmp_path):
    strategies = fuzz_runner.cases(bases)
    drawn = [(kind, case) for kind, n in PER_KIND.items() for case in fuzz_runner.draw(strategies[kind], n, SEED)]
    assert len(drawn) == sum(PER_KIND.values())
    failures = [o for o in fuzz_runner.run_all(drawn, bases, tmp_path) if o.problem]
    assert not failures, "\n".join(f"{o.problem}\n  mlxinfer {' '.join(o.args)}" for o in failures)
