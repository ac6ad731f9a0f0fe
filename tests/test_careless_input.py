"""What a careless user did to the CLI, and what each now gets: one line naming the real cause, exit 2,
nothing written half-way (a results file left byte for byte as it was), every argument checked before
any model runs.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import assert_one_line_error, invoke_cli

from mlxinfer.engine import prompt_list
from mlxinfer.engine.results import record_problem

PROMPT = "Name one herb."
LONG_CONST_JSON = json.dumps({"x": "a" * 20_000}, separators=(",", ":"))  # the one JSON its schema allows


@pytest.fixture(scope="module")
def sweep_file(checkpoint_dir, tmp_path_factory):
    """A finished two-seed sweep on the tiny 4-bit checkpoint: (model path, results file, its bytes)."""
    path = str(checkpoint_dir("llama", 4, 64))
    out = tmp_path_factory.mktemp("sweep") / "runs.jsonl"
    args = ["sweep", "-m", path, "--compute-dtype", "bfloat16", "-p", PROMPT, "--seeds", "3", "--max-tokens", "4"]
    done = invoke_cli(*args, "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    return path, args, out.read_bytes()


def _edited(record: dict, **changes) -> dict:
    out = {k: v for k, v in record.items() if changes.get(k, 0) is not None}
    out.update({k: v for k, v in changes.items() if v is not None})
    return out


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"first_token_prob": None}, "it has no first_token_prob"),  # was: a TypeError traceback
        ({"prompt_index": 7}, "its prompt_index is 7, not a whole number from 0 to 0"),  # was: IndexError, 3 -> 5 lines
        ({"settings_index": -1}, "its settings_index is -1"),
        ({"text": 12345}, "its text is 12345, not a string"),  # was: an AttributeError
        ({"first_token_prob": float("nan")}, "its first_token_prob is NaN"),  # was: accepted
        ({"first_token_prob": 1.5}, "its first_token_prob is 1.5"),
        ({"tokens": [1, "a"]}, 'its tokens is [1, "a"]'),
        ({"tokens": [10**9]}, "token ids below 384"),
        ({"seed": True}, "its seed is true"),
        ({"finish_reason": "done"}, "its finish_reason"),
        ({"prompt": "another prompt"}, "its prompt is not prompt 0 of the header"),
        ({"settings": {"temperature": 9}}, "its settings are not settings 0"),
    ],
)
def test_a_hand_edited_results_line_is_one_error_and_the_file_stays(sweep_file, tmp_path, change, fragment):
    path, args, whole = sweep_file
    lines = whole.decode().splitlines(keepends=True)
    lines[2] = json.dumps(_edited(json.loads(lines[2]), **change), allow_nan=True) + "\n"
    out = tmp_path / "edited.jsonl"
    out.write_bytes("".join(lines[:-1]).encode())  # the last completion missing: resume would redo it
    before = out.read_bytes()
    result = invoke_cli(*args, "--out", str(out), "--resume")
    assert_one_line_error(result, "line 3 is not a completion record", fragment)
    assert out.read_bytes() == before  # nothing appended, nothing cut


def test_a_record_whose_text_or_ending_is_not_what_its_tokens_give_is_refused(sweep_file, tmp_path):
    """Was: a line with its text changed to "Banana" (its tokens kept), its tokens emptied, or its first_token
    changed resumed with exit 0, and the tally counted the edited answer as drawn."""
    path, args, whole = sweep_file
    lines = whole.decode().splitlines(keepends=True)
    record = json.loads(lines[2])
    assert record["tokens"], "the check needs a record that drew tokens"
    cases = [
        ({"text": "Banana"}, "is not what its tokens give"),
        ({"tokens": []}, "is not what its tokens give"),
        ({"finish_reason": "stop" if record["finish_reason"] == "length" else "length"}, "is not what its tokens give"),
        ({"first_token": (record["tokens"][0] + 1) % 384}, f"its first_token is {(record['tokens'][0] + 1) % 384}"),
    ]
    for change, fragment in cases:
        edited = lines[:2] + [json.dumps({**record, **change}) + "\n"] + lines[3:-1]
        out = tmp_path / "edited.jsonl"
        out.write_bytes("".join(edited).encode())
        before = out.read_bytes()
        result = invoke_cli(*args, "--out", str(out), "--resume")
        assert_one_line_error(result, "--out", fragment)
        assert out.read_bytes() == before


def test_a_good_results_file_passes_the_check_record_by_record(sweep_file):
    _, _, whole = sweep_file
    header, *records = [json.loads(line) for line in whole.decode().splitlines()]
    assert len(records) == 3 and all(record_problem(r, header) is None for r in records)
    assert record_problem([], header) == "it is not a JSON object"


def test_a_prompts_file_that_never_ends_or_is_no_file_is_refused(checkpoint_dir, tmp_path):
    """Was: /dev/zero read until MemoryError (a traceback after a minute)."""
    path = str(checkpoint_dir("llama", 4, 64))
    big = tmp_path / "big.txt"
    with open(big, "wb") as f:
        f.truncate(prompt_list.MAX_PROMPTS_FILE_BYTES + 1)  # sparse: no disk spent
    many = tmp_path / "many.txt"
    many.write_text("hi\n" * (prompt_list.MAX_PROMPTS + 1))
    cases = [("/dev/zero", "is a device, not a file"), (str(tmp_path), "is a directory"),
             (str(tmp_path / "none.txt"), "does not exist"), (str(big), "is over 16,777,216 bytes"),
             (str(many), "holds 10,001 prompts; at most 10,000")]  # fmt: skip
    for prompts, fragment in cases:
        result = invoke_cli("sweep", "-m", path, "--prompts", prompts, "--seeds", "1")
        assert_one_line_error(result, "--prompts", fragment)


@pytest.mark.parametrize(
    "schema, fragment",
    [
        (
            {
                "type": "object",
                "$defs": {"a": {"$ref": "#/$defs/a"}},
                "properties": {"x": {"$ref": "#/$defs/a"}},
                "required": ["x"],
            },
            "#/properties/x is a $ref loop",
        ),  # fmt: skip
        ({"type": "object", "properties": {"x": {"$ref": "#/properties/x"}}}, "#/properties/x is a $ref loop"),
        (
            {
                "type": "object",
                "properties": {"x": {"type": "string", "pattern": "^a{1000000000}$"}},
                "required": ["x"],
            },
            "repeats 1,000,000,000 times",
        ),  # was: blamed on recursion  # fmt: skip
        (
            {"type": "object", "properties": {"x": {"const": "a" * 20_000}}, "required": ["x"]},
            "fixes %s bytes of the output before" % f"{len(LONG_CONST_JSON) - 1:,}",  # all of it but the last }
        ),  # fmt: skip
    ],
)
def test_a_schema_no_json_can_meet_is_refused_before_generation(checkpoint_dir, schema, fragment):
    """Was: `{"x` on stdout, then exit 1 with `RuntimeError: grammar error: NoExtensionBias` and a ~98-line dump."""
    path = str(checkpoint_dir("llama", 4, 64))
    result = invoke_cli("generate", "-m", path, "-p", "hi", "--max-tokens", "8", "--json-schema", json.dumps(schema))
    assert_one_line_error(result, "--json-schema", fragment)
    assert result.stdout == ""


def test_quality_checks_every_argument_before_the_reference_runs(monkeypatch, tmp_path):
    """Was: 52 s (the reference's whole run) before `quality embedded /nonexistent` said the candidate
    does not exist; `--text /dev/zero` "did not exist". The reference is never loaded here."""
    import mlxinfer_quant.quality

    loaded = []
    monkeypatch.setattr(
        mlxinfer_quant.quality, "load", lambda source: loaded.append(source) or pytest.fail("a model loaded")
    )
    (tmp_path / "empty").mkdir()
    cases = [
        (["embedded", "/nonexistent"], "no model at /nonexistent"),
        (["embedded", "tiny"], "no model at tiny"),
        (["embedded", str(tmp_path / "empty")], "no config.json in"),
        (["embedded", "embedded", "--text", "/dev/zero"], "--text /dev/zero is a device, not a file"),
        (["embedded", "embedded", "--text", str(tmp_path)], "is a directory"),
        (["embedded", "embedded", "--text", ""], "--text is empty"),  # was: the shipped text, silently
        (["embedded", "embedded", "--window", "1"], "--window must be 2 tokens or more"),
    ]
    for args, fragment in cases:
        assert_one_line_error(invoke_cli("quality", *args), fragment)
    assert loaded == []


def test_a_weights_file_that_links_to_a_device_is_named_as_such(checkpoint_dir, tmp_path):
    """Was: "is a directory" for a model.safetensors that is a symlink to /dev/zero."""
    src = checkpoint_dir("llama")
    model = tmp_path / "model"
    model.mkdir()
    for f in src.iterdir():
        if f.name != "model.safetensors":
            (model / f.name).write_bytes(f.read_bytes())
    os.symlink("/dev/zero", model / "model.safetensors")
    for args in (["count", str(model)], ["topk", "-m", str(model), "-p", "hi"]):
        assert_one_line_error(invoke_cli(*args), "model.safetensors is a device, not a file (a link to /dev/zero)")
    os.symlink("/dev/zero", tmp_path / "zero.gguf")
    assert_one_line_error(invoke_cli("count", str(tmp_path / "zero.gguf")), "zero.gguf is a device, not a file")


def test_blank_lines_in_a_results_file_resume(sweep_file, tmp_path):
    """A blank line (an editor's, `echo >>`) holds no record: --resume skips it (was: "line 32 is not a
    completion record ... (it is not JSON)") and draws only what is missing, the same records as a whole run."""
    path, args, whole = sweep_file
    lines = whole.decode().splitlines(keepends=True)
    out = tmp_path / "blank.jsonl"
    out.write_bytes("".join(lines[:2] + ["\n", "  \n"] + lines[2:-1] + ["\n"]).encode())
    result = invoke_cli(*args, "--out", str(out), "--resume")
    assert result.returncode == 0, result.stderr
    records = [json.loads(x) for x in out.read_text().splitlines() if x.strip()]
    assert sorted(map(json.dumps, records)) == sorted(json.dumps(json.loads(x)) for x in whole.decode().splitlines())


@pytest.mark.parametrize("command", ["topk", "tokens"])
def test_a_prompt_far_past_the_context_is_refused_from_its_first_part(command, tmp_path):
    """topk and tokens encoded a 12 MB prompt whole (17 s) before refusing it; generate, sample and the rest
    refused it from its first part. Now they all do."""
    huge = tmp_path / "huge.txt"
    huge.write_text("the cat " * 1_500_000)
    result = invoke_cli(command, "--prompt-file", str(huge), "--no-chat")
    assert_one_line_error(result, "in its first", "context")


def test_quality_and_tokens_give_one_perplexity(tmp_path):
    """quality read MLX's CPU logsumexp (~1.2e-4 low), tokens the exact log-softmax: 33.625 against 33.629
    on the same text and weights. Both now read the same."""
    import mlxinfer
    import mlxinfer_quant

    source = os.path.join(os.path.dirname(__file__), "..", "quant", "data", "eval.txt")
    text = tmp_path / "short.txt"
    text.write_text(open(source).read()[:1400])
    model, tok = mlxinfer.load("embedded@float32")
    want = mlxinfer.prompt_logprobs(model, tok, text.read_text(), chat=False).perplexity
    report = mlxinfer_quant.evaluate("embedded@float32", ["embedded"], text=text)
    assert abs(report.reference.perplexity - want) < 1e-6 * want, (report.reference.perplexity, want)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["generate", "Put basil on my shopping list"], "the prompt is an option here: -p TEXT"),
        (["topk", "-p", PROMPT, "--temp", "0.5,1"], "several temperatures go to --temps 0.5,1"),
        (["topk", "-p", PROMPT, "--model", "embeded"], "did you mean 'embedded'"),
    ],
    ids=["prompt-without-p", "temps-in-temp", "model-typo"],
)
def test_a_newcomers_first_mistakes_name_the_fix(args, fragment):
    """Was: Click's "unexpected extra argument", "'0.5,1' is not a valid float" and "no model at embeded" alone."""
    assert_one_line_error(invoke_cli(*args), fragment)
