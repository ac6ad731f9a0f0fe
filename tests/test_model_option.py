"""quantize, convert and quality take the model as --model/-m too, as the model commands do: the same
files and numbers as with the positional path."""

from __future__ import annotations

import json

import pytest
from conftest import assert_one_line_error, invoke_cli


def _files(d) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.suffix in (".safetensors", ".json")}


def test_quantize_and_quality_take_model(checkpoint_dir, tmp_path):
    src = str(checkpoint_dir("llama"))
    one, two = tmp_path / "one", tmp_path / "two"
    assert invoke_cli("quantize", src, str(one), "--bits", "4").returncode == 0
    r = invoke_cli("quantize", "--model", src, str(two), "--bits", "4", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["out"] == str(two)
    assert _files(one) == _files(two) and _files(one)

    def quality(*args):
        r = invoke_cli("quality", *args, "--max-tokens", "64", "--window", "32", "--json")
        assert r.returncode == 0, r.stderr
        return [(m["kl_mean"], m["top1_agreement"]) for m in json.loads(r.stdout)["candidates"]]

    assert quality("-m", src, str(one), str(two)) == quality(src, str(one), str(two))


def test_convert_takes_model(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    assert invoke_cli("convert", "embedded", str(one)).returncode == 0
    assert invoke_cli("convert", "-m", "embedded", str(two)).returncode == 0
    assert _files(one) == _files(two) and _files(one)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["quantize"], "give the model"),
        (["quantize", "--model", "embedded"], "SRC OUT, or --model SRC OUT"),
        (["quantize", "--model", "embedded", "a", "b"], "not both"),
        (["convert", "-m", "embedded"], "GGUF OUT, or --model GGUF OUT"),
        (["quality", "-m", "embedded"], "at least one model to compare"),
        (["quality"], "give the model"),
        (["convert", "", "out"], "GGUF is blank"),  # was: "--model is blank", a flag not given
        (["convert", "-m", "", "out"], "--model is blank"),
        (["quality", "embedded", ""], "a model (REFERENCE or CANDIDATE) is blank"),
    ],
)
def test_a_missing_or_doubled_model_is_one_line(args, fragment):
    assert_one_line_error(invoke_cli(*args), fragment)
