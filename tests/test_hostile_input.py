"""Hostile input on the command line and in the API: strict JSON out, one rule for temperatures,
user text that cannot open a turn of its own, schemas the grammar engine gives up on, prompts
that are not UTF-8."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, assert_one_line_error, invoke_cli



def strict_json(text: str):
    """json.loads that refuses NaN, Infinity and -Infinity (which Python's json accepts and JSON does not)."""

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


# ---------------------------------------------------------------------------------------------- JSON
def test_json_output_is_strict_json(checkpoint_dir):
    """Was: `-Infinity` in --json for the log-probabilities of tokens the grammar refused."""
    schema = '{"type":"object","properties":{"a":{"type":"boolean"}},"required":["a"]}'
    args = ["-m", str(checkpoint_dir("llama")), "-p", "hi", "--temp", "0"]
    out = invoke_cli("generate", *args, "--json-schema", schema, "--logprobs", "3", "--explain-mask", "--json")
    assert out.returncode == 0, out.stderr
    data = strict_json(out.stdout)
    assert data["valid"] is True
    masked = [a for s in data["steps"] for a in s["alternatives"] if a["logprob"] is None]
    assert masked  # the grammar allowed fewer than 3 tokens somewhere: their -inf became null


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1"])
@pytest.mark.parametrize("flag", ["--temp", "--temps"])
def test_temp_and_temps_share_one_rule(checkpoint_dir, flag, value):
    """Was: --temps nan printed NaN probabilities and --temps inf was accepted while --temp refused both."""
    result = invoke_cli("topk", "-m", str(checkpoint_dir("llama")), "-p", "hi", f"{flag}={value}", "--json")
    assert_one_line_error(result, f"{flag} must be >= 0", value)


# ---------------------------------------------------------------------------------------------- prompts
def test_prompt_that_is_not_utf8_is_one_line(checkpoint_dir):
    """Bytes that are not UTF-8 reach Python as lone surrogates; they are refused after the model loads."""
    for flag in ("-p", "--system"):
        args = [b"topk", b"-m", str(checkpoint_dir("llama")).encode(), b"-p", b"hi"]
        args += [flag.encode(), b"caf\xe9 \xff"]
        result = subprocess.run(
            [sys.executable.encode(), b"-m", b"mlxinfer", *args], cwd=ROOT, capture_output=True, env=os.environ
        )
        done = subprocess.CompletedProcess(args, result.returncode, result.stdout.decode(), result.stderr.decode())
        assert_one_line_error(done, "not valid UTF-8")


def test_model_path_that_is_not_utf8_is_shown_not_a_crash(checkpoint_dir, tmp_path):
    """A directory name that is not UTF-8 is printed escaped. Was: UnicodeEncodeError where stdout is strict
    UTF-8 (a macOS terminal; PYTHONIOENCODING=utf-8:strict here)."""
    odd = os.fsdecode(bytes(tmp_path) + b"/caf\xe9")
    os.mkdir(odd)
    (tmp_path / odd / "config.json").write_text((checkpoint_dir("llama") / "config.json").read_text())
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    result = subprocess.run(
        [sys.executable, "-m", "mlxinfer", "count", odd, "--json"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert strict_json(result.stdout)["model"] == odd
    missing = subprocess.run(
        [sys.executable, "-m", "mlxinfer", "count", odd + "x"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert_one_line_error(missing, "no model at")
