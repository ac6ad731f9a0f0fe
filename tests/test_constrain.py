"""Constrained decoding: a JSON Schema (or a strict tool) becomes a grammar mask before the draw.

Real-model runs are on the embedded SmolLM2-135M (one shared prefill for the greedy run and
ten seeds); the other shapes run on tiny random checkpoints, where the mask alone has to
produce valid JSON; the CLI cases use tiny checkpoints so that only the mask is on trial.
"""

from __future__ import annotations

import json
import math
import re

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from conftest import ROOT, assert_one_line_error, invoke_cli

import mlxinfer
from mlxinfer import SamplerSettings
from mlxinfer.engine import constrain
from mlxinfer.engine.constrain import allowed_from_bitmask, compile_schema, token_table
from mlxinfer.engine.schema import Constraint
from mlxinfer.errors import MlxinferError
from mlxinfer.tokenizer import encode_prompt

EXAMPLES = ROOT / "examples"
TOOL_FILE = EXAMPLES / "add_to_shopping_list.json"
RECIPE = EXAMPLES / "recipe_card.json"  # nested object, pattern, boolean, enum, bounded integer
OVEN = EXAMPLES / "oven_readings.json"  # array of numbers, enum, array of short strings
BASIL = "Put basil on my shopping list."
UNITS = ["g", "kg", "ml", "l", "tsp", "tbsp", "piece", "bunch"]


def load_tool(path):
    tool = Constraint.read(None, str(path)).tool
    return tool, tool["input_schema"]


def load_schema(path):
    return Constraint.read(str(path), None).schema


def run(model, tok, prompt, temperature=0.0, max_tokens=64, seed=None, **constraint):
    """mlxinfer.generate with a schema or a tool (dicts), like the README's Python section."""
    return mlxinfer.generate(
        model,
        tok,
        prompt,
        settings=SamplerSettings(temperature=temperature),
        max_tokens=max_tokens,
        seed=seed,
        **constraint,
    )


def test_example_tool_is_the_lessons():
    tool, schema = load_tool(TOOL_FILE)
    assert tool["name"] == "add_to_shopping_list" and tool["strict"] is True
    item = schema["properties"]["items"]["items"]
    assert item["properties"]["unit"]["enum"] == UNITS
    assert item["properties"]["quantity"] == {"type": "number"}
    assert item["required"] == ["name", "quantity", "unit"] and item["additionalProperties"] is False
    assert schema["required"] == ["items"] and schema["additionalProperties"] is False


# ----------------------------------------------------------------------------- the embedded model
@pytest.mark.slow
def test_shopping_list_greedy_and_ten_seeds(embedded_fast):
    """Put basil on the list: schema-valid JSON greedily and at temperature 1.0 for seeds 0..9;
    the same text as the CLI's `generate --tool FILE --temp 0 --json`."""
    model, tok = embedded_fast
    tool, schema = load_tool(TOOL_FILE)

    result = run(model, tok, BASIL, 0.0, tool=tool, explain_mask=True)
    assert result.finish_reason == "stop" and result.valid, result
    jsonschema.validate(result.parsed, schema)
    assert result.text == json.dumps(result.parsed, separators=(",", ":"), ensure_ascii=False)  # compact
    cli = json.loads(
        invoke_cli(
            "generate",
            "-p",
            BASIL,
            "--tool",
            str(TOOL_FILE),
            "--temp",
            "0",
            "--json",
            "--compute-dtype",
            "float32",
            "--max-tokens",
            "64",
        ).stdout
    )
    assert cli["text"] == result.text and cli["valid"] is True and cli["tool"] == "add_to_shopping_list"

    # the lesson's table: after "quantity": only the start of a number is allowed
    rows = result.mask_steps
    at = next(r for r in rows if r["text"].endswith('"quantity":'))
    assert re.fullmatch(r"-|\d", at["allowed_text"]) and re.fullmatch(r"-|\d", at["chosen_text"])
    assert at["n_allowed"] == 11  # '-' and the ten digits: SmolLM2 writes numbers one digit at a time
    assert at["refused_id"] >= 0 and not re.match(r"[-\d]", at["refused_text"]) and at["refused_score"] > -1e30
    assert rows[-1]["chosen_id"] == -1 and rows[-1]["n_allowed"] == 1  # then only the end of the turn
    assert rows[0]["n_allowed"] <= 2  # '{' or '{"'

    # ten seeds in one batch, each row with its own grammar mask
    report = mlxinfer.sample(model, tok, BASIL, seeds=10, settings={"temperature": 1.0}, max_tokens=96, tool=tool)
    for c in report.completions:
        assert c.finish_reason == "stop" and c.valid, c
        jsonschema.validate(c.parsed, schema)
    assert len({c.text for c in report.completions}) > 1  # the values are the model's choice: seeds differ


@pytest.mark.slow
def test_a_json_schema_dict_gives_the_clis_text(embedded_fast):
    model, tok = embedded_fast
    schema = load_schema(OVEN)
    result = run(model, tok, "Oven readings 180, 185 and 190 C as JSON:", json_schema=schema, max_tokens=48)
    assert result.valid and result.tool is None
    jsonschema.validate(result.parsed, schema)
    cli = json.loads(
        invoke_cli(
            "generate",
            "-p",
            "Oven readings 180, 185 and 190 C as JSON:",
            "--json-schema",
            json.dumps(schema),
            "--temp",
            "0",
            "--json",
            "--compute-dtype",
            "float32",
            "--max-tokens",
            "48",
        ).stdout
    )
    assert cli["text"] == result.text and cli["parsed"] == result.parsed


@pytest.mark.slow
def test_array_of_numbers_on_the_embedded_model(embedded_fast):
    model, tok = embedded_fast
    schema = load_schema(OVEN)
    ids = encode_prompt(tok, "Oven readings 180, 185 and 190 C as JSON:", chat=False)
    result = run(model, tok, ids, json_schema=schema, max_tokens=48)
    assert result.finish_reason == "stop" and result.valid, result
    jsonschema.validate(result.parsed, schema)


# ----------------------------------------------------------------------------- random weights
@pytest.mark.slow
@pytest.mark.parametrize("variant", [("llama", None, None), ("qwen3", 4, 128)])
@pytest.mark.parametrize("schema_file", [RECIPE, OVEN])
def test_random_weights_still_write_valid_json(loaded, variant, schema_file):
    """A tiny random model has no idea what JSON is: the mask alone gives the shape."""
    model, tok = loaded(*variant)
    assert model.config.vocab_size > len(tok)  # padded rows that must never be drawn
    schema = load_schema(schema_file)
    for seed in [None, 0, 1, 2, 3, 4]:
        result = run(
            model, tok, "Name one herb.", 0.0 if seed is None else 1.0, max_tokens=256, seed=seed, json_schema=schema
        )
        assert result.finish_reason == "stop" and result.valid, (seed, result)
        jsonschema.validate(result.parsed, schema)
        assert all(t < len(tok) for t in result.tokens)


# ----------------------------------------------------------------------------- the mask, token by token
def _state(tok, compiled, prefix: str):
    matcher = compiled.matcher()
    assert matcher.consume_tokens(tok.encode(prefix, add_special_tokens=False)), matcher.get_error()
    mask = compiled.mask()
    mask.matcher = matcher
    return mask


def _ids(allowed: np.ndarray) -> list[int]:
    return np.nonzero(allowed)[0].tolist()


@pytest.mark.slow
def test_every_allowed_token_keeps_a_valid_prefix(embedded):
    """Checked without the grammar engine: each allowed token can still be completed to a
    document the schema accepts; known illegal tokens are refused."""
    _, tok = embedded
    _, schema = load_tool(TOOL_FILE)
    compiled = compile_schema(tok, schema)
    table = token_table(tok)

    prefix = '{"items":[{"name":"basil","quantity":'
    allowed = _state(tok, compiled, prefix).allowed()
    assert 0 < allowed.sum() < 50
    for t in _ids(allowed):
        text = table.decode([t])
        number = text + ("" if text[-1:].isdigit() else "1")
        doc = json.loads(prefix + number + ',"unit":"g"}]}')
        jsonschema.validate(doc, schema)
    quote, a = tok.encode('"a', add_special_tokens=False)
    assert not allowed[quote] and not allowed[a]  # the lesson's "a loses: both are illegal here
    assert not allowed[tok.encode(" a", add_special_tokens=False)[0]]
    assert not allowed[sorted(tok.eos_token_ids)[0]]  # the end of the turn is not allowed mid-JSON

    prefix = '{"items":[{"name":"basil","quantity":1,"unit":"'
    allowed = _state(tok, compiled, prefix).allowed()
    endings = [u + '"' + tail for u in UNITS for tail in ("}]}", '},{"name":"')]
    for t in _ids(allowed):
        text = table.decode([t])
        assert any(e.startswith(text) for e in endings), text
    assert allowed[tok.encode("bunch", add_special_tokens=False)[0]]
    assert not allowed[tok.encode("cup", add_special_tokens=False)[0]]

    # inside a free string almost anything goes, but never a control token
    allowed = _state(tok, compiled, '{"items":[{"name":"').allowed()
    assert allowed.sum() > 40000
    specials = [i for i in range(len(tok)) if table.ll.is_special_token(i)]
    assert set(tok.eos_token_ids) <= set(specials) and len(specials) >= 3
    assert not allowed[specials].any()

    # closed: only the end of the turn can follow, and the mask says so
    done = _state(tok, compiled, '{"items":[{"name":"basil","quantity":1,"unit":"bunch"}]}')
    assert done.is_finished()
    assert _ids(done.allowed()) == sorted(tok.eos_token_ids)


def test_or_text_takes_the_json_or_text_that_does_not_open_it(embedded):
    """tool_choice auto's grammar: the schema's JSON, or plain text; the first character decides."""
    from mlxinfer.engine.constrain import finish

    _, tok = embedded
    _, schema = load_tool(TOOL_FILE)
    compiled = compile_schema(tok, schema, or_text=True)
    assert compiled is not compile_schema(tok, schema)  # cached apart from the JSON-only grammar
    eos = sorted(tok.eos_token_ids)[0]
    call = '{"items":[{"name":"basil","quantity":1,"unit":"bunch"}]}'
    for text, finished in ((call, True), ("Basil is an herb. {not a call}", False)):
        mask = _state(tok, compiled, text)
        assert mask.is_finished() == finished and mask.is_accepting() and mask.allowed()[eos]
        ids = tok.encode(text, add_special_tokens=False)
        result = finish(compiled.mask(), text, ids, "stop")
        assert result.text_answer == (not finished) and result.valid == finished
        assert result.parsed == (json.loads(call) if finished else None)
    start = compiled.mask().allowed()
    # no empty answer, no leading newline; one leading space is a word start (SentencePiece's ▁Basil)
    assert not start[eos] and not start[tok.encode("\n", add_special_tokens=False)[0]]
    assert (
        start[tok.encode(" Basil", add_special_tokens=False)[0]]
        and not start[tok.encode(" {", add_special_tokens=False)[0]]
    )
    assert (
        start[tok.encode("Basil", add_special_tokens=False)[0]] and start[tok.encode("{", add_special_tokens=False)[0]]
    )
    wrong = _state(tok, compiled, '{"items":').allowed()  # once opened, the JSON must be the schema's
    assert (
        not wrong[tok.encode('"', add_special_tokens=False)[0]] and wrong[tok.encode("[", add_special_tokens=False)[0]]
    )
    with pytest.raises(MlxinferError, match="or_text needs json_schema or tool"):
        Constraint.read(None, None, or_text=True)


def test_a_tool_may_leave_description_and_strict_null():
    tool = {"name": "t", "description": None, "strict": None, "input_schema": {"type": "object"}}
    assert Constraint.read(None, tool).tool["name"] == "t"  # null is common in generated tool files
    with pytest.raises(MlxinferError, match="strict must be true or false"):
        Constraint.read(None, {**tool, "strict": "yes"})


def test_padded_rows_are_always_masked(loaded):
    model, tok = loaded("llama")
    compiled = compile_schema(tok, load_schema(RECIPE))
    mask = compiled.mask(model.config.vocab_size)
    logits = mx.zeros((1, model.config.vocab_size))
    out = mask(mx.array(encode_prompt(tok, "Name one herb.")), logits)
    kept = np.array(out[0] > -float("inf"))
    assert not kept[len(tok) :].any() and kept.any()
    bits = np.full((1, 2), -1, dtype=np.int32)  # every bit set: still nothing past the table
    assert allowed_from_bitmask(bits, 40, 64).tolist() == [True] * 40 + [False] * 24


def test_compiled_grammars_and_token_tables_are_cached(embedded):
    _, tok = embedded
    _, schema = load_tool(TOOL_FILE)
    assert token_table(tok) is token_table(tok)
    assert compile_schema(tok, schema) is compile_schema(tok, json.loads(json.dumps(schema)))
    a, b = compile_schema(tok, schema).mask(), compile_schema(tok, schema).mask()
    assert a.matcher is not b.matcher  # each generation gets its own matcher


def test_the_grammar_cache_keeps_the_schemas_used_last(embedded):
    """A server compiles one schema per request: many distinct ones must not grow the process without
    bound. The cache holds the last GRAMMAR_CACHE used; the oldest is compiled again when it comes back."""
    _, tok = embedded
    first = compile_schema(tok, {"type": "object", "properties": {"p0": {"type": "integer"}}})
    kept = [compile_schema(tok, {"type": "object", "properties": {f"p{i}": {"type": "integer"}}})
            for i in range(1, constrain.GRAMMAR_CACHE + 5)]  # fmt: skip
    assert len(constrain._GRAMMARS) <= constrain.GRAMMAR_CACHE
    assert compile_schema(tok, {"type": "object", "properties": {"p0": {"type": "integer"}}}) is not first
    last = {"type": "object", "properties": {f"p{constrain.GRAMMAR_CACHE + 4}": {"type": "integer"}}}
    assert compile_schema(tok, last) is kept[-1]


# ----------------------------------------------------------------------------- the token budget
@pytest.mark.slow
def test_cut_json_is_flagged_never_silent(embedded_fast):
    model, tok = embedded_fast
    tool, schema = load_tool(TOOL_FILE)
    result = run(model, tok, "basil", max_tokens=4, chat=False, json_schema=schema)
    assert result.finish_reason == "length" and not result.valid and result.parsed is None
    assert "NOT valid JSON" in result.warning


def test_cli_tool_json_output(checkpoint_dir):
    ckpt = str(checkpoint_dir("qwen3", 4, 128))
    r = invoke_cli(
        "generate",
        "-m",
        ckpt,
        "-p",
        BASIL,
        "--tool",
        str(TOOL_FILE),
        "--temp",
        "0",
        "--max-tokens",
        "200",
        "--json",
        "--explain-mask",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["valid"] is True and out["finish_reason"] == "stop" and out["tool"] == "add_to_shopping_list"
    jsonschema.validate(out["parsed"], load_tool(TOOL_FILE)[1])
    assert json.loads(out["text"]) == out["parsed"]
    assert len(out["mask_steps"]) == len(out["tokens"]) + 1
    assert {"text", "n_allowed", "allowed_text", "allowed_score", "refused_text", "refused_score"} <= set(
        out["mask_steps"][0]
    )


@pytest.mark.parametrize("json_out", [False, True])
def test_cli_cut_gives_length_and_a_warning(checkpoint_dir, json_out):
    ckpt = str(checkpoint_dir("qwen3", 4, 128))
    args = ["generate", "-m", ckpt, "-p", BASIL, "--json-schema", str(RECIPE), "--temp", "0", "--max-tokens", "5"]
    r = invoke_cli(*args, *(["--json"] if json_out else ["--explain-mask"]))
    assert r.returncode == 1
    assert "warning:" in r.stderr and "NOT valid JSON" in r.stderr and "--max-tokens" in r.stderr
    if json_out:
        out = json.loads(r.stdout)
        assert out["valid"] is False and out["parsed"] is None and out["finish_reason"] == "length"
        assert out["stats"]["finish_reason"] == "length"
    else:
        assert "finish: length" in r.stderr and "best refused" in r.stdout


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "option,value,fragment",
    [
        ("--json-schema", '{"type": object}', "not valid JSON"),
        ("--json-schema", "no-such-file.json", "neither a file nor inline JSON"),
        ("--json-schema", str(EXAMPLES), "examples is a directory"),  # was: "neither a file nor inline JSON"
        ("--json-schema", "", "--json-schema is empty"),  # was: "--json-schema . is a directory"
        ("--tool", " ", "--tool is empty"),
        ("--json-schema", json.dumps({"type": "object", "properties": {"a": {"pattern": "[a-"}}}), "not a valid"),
        ("--json-schema", "[1, 2]", "must be a JSON object"),
        ("--json-schema", '{"type": "string"}', '"type": "object"'),
        (
            "--json-schema",
            json.dumps({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}),
            "cannot express",
        ),
        (
            "--json-schema",
            json.dumps({"type": "object", "properties": {"a": {"type": "array", "uniqueItems": True}}}),
            "uniqueItems",
        ),
        (
            "--json-schema",
            json.dumps({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?=a)b"}}}),
            "look-around",
        ),
        ("--json-schema", str(TOOL_FILE), "pass that as --tool"),
        ("--tool", json.dumps({"name": "x", "description": "no schema"}), "input_schema"),
        ("--tool", json.dumps({"name": "x", "input_schema": {"type": "array"}}), '"type": "object"'),
    ],
)
def test_bad_schemas_are_one_line_errors(checkpoint_dir, option, value, fragment):
    r = invoke_cli("generate", "-m", str(checkpoint_dir("llama")), "-p", "hi", option, value)
    assert_one_line_error(r, fragment)


def test_unsupported_feature_fails_at_compile_time(embedded, tmp_path):
    _, tok = embedded
    schema = {"type": "object", "properties": {"a": {"if": {"type": "string"}, "then": {"minLength": 2}}}}
    with pytest.raises(MlxinferError) as e:
        compile_schema(tok, schema)  # no model involved: before any forward pass
    assert "\n" not in str(e.value)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    r = invoke_cli("generate", "-p", "hi", "--json-schema", str(bad))
    assert_one_line_error(r, "not valid JSON")


def test_both_constraints_or_a_lonely_explain_are_errors():
    assert_one_line_error(
        invoke_cli("generate", "-p", "hi", "--json-schema", str(RECIPE), "--tool", str(TOOL_FILE)), "not both"
    )
    assert_one_line_error(invoke_cli("generate", "-p", "hi", "--explain-mask"), "--explain-mask")


def test_alternatives_under_a_mask_are_tokens_the_row_could_draw(embedded_fast):
    """logprobs=5 under a tool's grammar: where fewer than five tokens are allowed, the masked ones (logprob
    -inf, taken in id order) were listed, and to_dict() was not strict JSON. Now each alternative is a
    token the grammar allows, with a finite logprob, and the chosen token is among them."""
    model, tok = embedded_fast
    tool, _ = load_tool(TOOL_FILE)
    g = mlxinfer.generate(model, tok, BASIL, tool=tool, settings=mlxinfer.GREEDY, max_tokens=12, logprobs=5)
    json.dumps(g.to_dict(), allow_nan=False)
    assert any(len(s.alternatives) < 5 for s in g.steps)  # a place the grammar allows fewer than five
    for step in g.steps:
        assert all(math.isfinite(a.logprob) for a in step.alternatives), step
        assert step.token is None or step.token in [a.id for a in step.alternatives]  # greedy: the best allowed


@pytest.mark.parametrize(
    "schema, text, said",
    [
        ({"type": "object", "properties": {"v": {"type": "string", "format": "date"}}}, '{"v":"2023-02-29"}',
         "is not a 'date'"),
        ({"type": "object", "properties": {"v": {"type": "number", "exclusiveMaximum": 1}}},
         '{"v":0.999999999999999999999999999999999999999998}', "greater than or equal to the maximum of 1"),
        ({"type": "object", "properties": {"v": {"type": "number"}}}, '{"v":1e999}', "past float's range"),
        ({"type": "object", "patternProperties": {"^x_": {"type": "integer"}}}, '{"x_a":2,"x_a":200}',
         "the key 'x_a' is written twice"),
    ],
)  # fmt: skip
def test_a_complete_json_the_schema_refuses_is_not_valid(schema, text, said):
    """llguidance's grammar lets these through (each drawn by the embedded model at T = 1); the result said
    valid: true. jsonschema checks each complete JSON again: valid false, with a warning naming why."""
    import types

    class Accepting:  # a mask whose grammar accepted the text
        compiled = types.SimpleNamespace(schema=schema, or_text=False)

        def advance(self, tokens):
            pass

        def is_finished(self):
            return True

    result = constrain.finish(Accepting(), text, [1, 2], "stop")
    assert result.valid is False and result.finish_reason == "stop" and said in result.warning, result.warning
    assert "\n" not in result.warning
    fine = constrain.finish(Accepting(), '{"v":"2024-02-29"}' if "date" in said else '{"v":0.5}', [1], "stop")
    assert "past float" in said or "twice" in said or fine.valid  # a value the schema takes stays valid
    if "twice" not in said and "float" not in said:
        with pytest.raises(jsonschema.ValidationError):  # the independent check agrees
            jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())
