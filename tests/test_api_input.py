"""The Python API as a notebook calls it: numpy's numbers are numbers, a text alone is one prompt, any
iterable of settings is read once, and a wrong argument is one MlxinferError naming it, never a raw
TypeError from deep inside, a silent wrong result or an argument ignored."""

from __future__ import annotations

import json
import re

import mlx.core as mx
import numpy as np
import pytest

import mlxinfer

PROMPT = "Name one fruit."


def test_numpy_numbers_give_what_python_numbers_give(embedded_quantized):
    """Was: max_tokens=np.int64(2) refused as 'not a whole number, got 2'; seeds=np.int64(2) a TypeError;
    np.float32 temperatures refused."""
    model, tok = embedded_quantized
    want = mlxinfer.generate(model, tok, PROMPT, max_tokens=3, seed=7, settings={"temperature": 0.5, "top_k": 5})
    got = mlxinfer.generate(
        model, tok, PROMPT, max_tokens=np.int64(3), seed=np.int64(7),
        settings={"temperature": np.float32(0.5), "top_k": np.int64(5)},
    )  # fmt: skip
    assert got.tokens == want.tokens and got.seed == 7 and type(got.seed) is int
    json.dumps(got.to_dict())  # every number a Python one: JSON holds it
    info = json.loads(json.dumps(model.info.to_dict()))  # was: no to_dict, and asdict's Path no JSON
    assert info["source"]["path"] == str(model.info.source.path) and info["compute_dtype"] == model.info.compute_dtype
    drawn = mlxinfer.sample(model, tok, PROMPT, seeds=np.arange(3), max_tokens=2)
    assert [c.seed for c in drawn.completions] == [0, 1, 2]
    assert [c.tokens for c in drawn.completions] == [
        c.tokens for c in mlxinfer.sample(model, tok, PROMPT, seeds=np.int64(3), max_tokens=2).completions
    ]
    table = mlxinfer.next_token_table(model, tok, PROMPT, temperatures=np.array([0.5, 1.0])[0], k=np.int64(3))
    assert len(table.rows) == 3 and table.temperatures == [0.5]
    # SamplerSettings built by hand with numpy's numbers (was: "temperature must be >= 0 ..., got np.float32(0.5)")
    made = mlxinfer.SamplerSettings(temperature=np.float32(0.5), top_k=np.int64(5)).validate()
    assert (type(made.temperature), type(made.top_k)) == (float, int)
    assert type(mlxinfer.SamplerSettings(temperature=1).temperature) is float  # was: the note said "temperature 1"
    assert mlxinfer.generate(model, tok, PROMPT, max_tokens=3, seed=7, settings=made).tokens == want.tokens
    # token ids as a numpy or MLX array, as mlx-lm's generate takes them (was: "got ndarray")
    ids = want.prompt_ids
    for array in (np.array(ids), mx.array(ids), np.array(ids, dtype=np.int32)):
        got = mlxinfer.generate(model, tok, array, max_tokens=3, seed=7, settings={"temperature": 0.5, "top_k": 5})
        assert got.tokens == want.tokens and got.prompt_ids == ids
    with pytest.raises(mlxinfer.MlxinferError, match=re.escape("one row (1-D), got an array of shape (1, 2)")):
        mlxinfer.generate(model, tok, np.array([ids[:2]]), max_tokens=3)


def test_a_text_alone_and_settings_from_a_generator(embedded_quantized):
    """Was: sweep("Hi") swept "H" and "i" as two prompts; settings from a generator were used up by the
    emptiness check, so the sweep ran no cell (and answers raised an MLX ValueError)."""
    model, tok = embedded_quantized
    one = mlxinfer.sweep(model, tok, PROMPT, settings=(s for s in [{"temperature": 1.0}]), seeds=2, max_tokens=2)
    listed = mlxinfer.sweep(model, tok, [PROMPT], settings=[{"temperature": 1.0}], seeds=2, max_tokens=2)
    assert [c.prompt for c in one.cells] == [PROMPT] and len(one.records) == 2
    assert [r.tokens for r in one.records] == [r.tokens for r in listed.records]
    walked = mlxinfer.answers(model, tok, PROMPT, settings=iter([{"temperature": 1.0}]), max_tokens=2, max_nodes=4)
    assert walked.nodes == 4
    assert mlxinfer.settings_grid(0.5) == mlxinfer.settings_grid([0.5]) == [{"temperature": 0.5}]


def test_a_stream_is_read_once(embedded_quantized):
    """Was: a second pass decoded again into the same stats (4 tokens became 8), or failed inside the grammar."""
    model, tok = embedded_quantized
    stream = mlxinfer.stream_generate(model, tok, PROMPT, max_tokens=4, seed=0)
    with pytest.raises(mlxinfer.MlxinferError, match="no result yet: iterate it"):  # was: None, then AttributeError
        _ = stream.result
    text = "".join(step.text for step in stream)
    with pytest.raises(mlxinfer.MlxinferError, match="already iterated"):
        list(stream)
    assert stream.result.text == text and stream.result.stats.generated_tokens == len(stream.result.tokens)


def test_chat_session_takes_sampler_settings(embedded_quantized):
    """Was: ChatSession(settings=GREEDY) a TypeError, check_settings(GREEDY) refused its own type."""
    model, tok = embedded_quantized
    session = mlxinfer.ChatSession(model, tok, settings=mlxinfer.GREEDY, max_tokens=4)
    reply = "".join(session.reply(PROMPT))
    assert reply == mlxinfer.generate(model, tok, [{"role": "user", "content": PROMPT}], settings=mlxinfer.GREEDY,
                                      max_tokens=4).text  # fmt: skip
    assert mlxinfer.check_settings(mlxinfer.GREEDY)["temperature"] == 0.0


BAD = [
    ("sweep", dict(prompts=None), "prompts must be"),
    ("sweep", dict(prompts=[1, 2, 3]), "one prompt's token ids"),
    ("sweep", dict(prompts=[[{"role": "user", "content": "hi"}]]), "chat messages"),
    ("sweep", dict(settings=None), "settings must be"),
    ("sweep", dict(settings=[]), "it is empty"),
    ("sweep", dict(settings=[{"temperature": 1}, {"temperature": 1.0}]), "are the same sampler"),  # was: two cells
    ("sample", dict(seeds=None), "seeds must be"),
    ("sample", dict(seeds=2.0), "seeds must be"),
    ("sample", dict(seeds="\u00b2"), "seeds takes"),  # '²'.isdigit() is True, int('²') fails
    ("sample", dict(seeds=[0, -3]), "got -3 among them"),  # was: no word of which
    ("sample", dict(seeds=[]), "seeds is an empty list"),
    ("sample", dict(min_mass=float("nan")), "min_mass"),  # was: ignored where exact is off
    ("sample", dict(max_nodes=-1), "max_nodes"),
    ("sample", dict(progress=5), "progress must be a function"),  # was: a TypeError mid-run
    ("generate", dict(system=5), "system must be text"),  # was: AttributeError 'int' has no 'encode'
    ("generate", dict(settings={"temperature": 10**400}), "temperature must be"),  # was: an OverflowError
    ("generate", dict(settings={"temperature": 10**5000}), "got an int of about 5,001 digits"),  # was: ValueError
    ("sample", dict(seeds=[1, 10**5000]), "got an int of about 5,001 digits among them"),
    ("generate", dict(settings={1: 0.5, "temp": 1}), "unknown sampling setting"),  # was: a TypeError sorting keys
    # was: accepted, and the row wrote {"a": null ...}, which the schema's NaN could never equal
    ("generate", dict(json_schema={"type": "object", "properties": {"a": {"const": float("nan")}}}), "NaN"),
    ("generate", dict(json_schema={"type": "object", "properties": {1: {}, "a": {}}}), "holds what JSON cannot"),
    # a switch that is not True or False: was read as `if value:` ("no" is true: the chat template ran)
    ("generate", dict(chat="no"), "chat must be True or False, got 'no'"),
    ("generate", dict(thinking=1), "thinking must be True or False, got 1"),
    ("generate", dict(raw_special_tokens="false"), "raw_special_tokens must be True or False"),
    ("generate", dict(json_schema={"type": "object"}, explain_mask="yes"), "explain_mask must be True or False"),
    ("sample", dict(chat=None), "chat must be True or False, got None"),
    ("sample", dict(exact="no"), "exact must be True or False"),  # was: every seed drawn, then the walk
    ("sweep", dict(resume="no"), "resume must be True or False"),  # was: "resume needs out"
    ("sweep", dict(exact=0), "exact must be True or False"),
]


@pytest.mark.parametrize("function,change,fragment", BAD, ids=[f"{f}-{'-'.join(c)}" for f, c, _ in BAD])
def test_a_wrong_argument_is_one_error_naming_it(embedded_quantized, function, change, fragment):
    model, tok = embedded_quantized
    args = {
        "sweep": dict(prompts=[PROMPT], settings=[{"temperature": 1.0}], seeds=1, max_tokens=2),
        "sample": dict(prompt=PROMPT, seeds=1, max_tokens=2),
        "generate": dict(prompt=PROMPT, max_tokens=2),
    }[function]
    args.update(change)
    first = args.pop("prompts" if function == "sweep" else "prompt")
    with pytest.raises(mlxinfer.MlxinferError, match=fragment):
        getattr(mlxinfer, function)(model, tok, first, **args)


def test_the_pair_load_returns_is_checked_where_it_is_taken(embedded_quantized, loaded):
    """Was: generate((model, tokenizer), tokenizer, ...) an AttributeError on 'tuple'; a tokenizer of None
    'this model has no chat template; pass chat=False' (following it: another AttributeError)."""
    model, tok = embedded_quantized
    calls = {
        "generate": lambda m, t: mlxinfer.generate(m, t, PROMPT, max_tokens=1),
        "sample": lambda m, t: mlxinfer.sample(m, t, PROMPT, seeds=1, max_tokens=1),
        "answers": lambda m, t: mlxinfer.answers(m, t, PROMPT, settings=[{}], max_nodes=1),
        "sweep": lambda m, t: mlxinfer.sweep(m, t, [PROMPT], settings=[{}], seeds=1, max_tokens=1),
        "next_token_table": lambda m, t: mlxinfer.next_token_table(m, t, PROMPT),
        "prompt_logprobs": lambda m, t: mlxinfer.prompt_logprobs(m, t, PROMPT),
        "ChatSession": lambda m, t: mlxinfer.ChatSession(m, t),
    }
    other, other_tok = loaded("qwen3")  # a tiny checkpoint: another vocabulary
    wrong = [
        ((model, tok), tok, "model must be the model load() returns, got tuple"),
        (tok, model, "model must be"),
        (model, None, "tokenizer must be the tokenizer"),
        # was: the tiny tokenizer's ids read by SmolLM2, garbage text and no error; or an error about ids
        (model, other_tok, "the tokenizer is not this model's: its vocabulary (300 tokens)"),
        (other, tok, "the tokenizer is not this model's: its vocabulary (49152 tokens)"),
    ]
    for call in calls.values():
        for m, t, fragment in wrong:
            with pytest.raises(mlxinfer.MlxinferError, match=re.escape(fragment)):
                call(m, t)
    for call, fragment in [  # each value once, as the CLI's --temps 1,1 and the server's answers say
        (lambda: mlxinfer.next_token_table(model, tok, PROMPT, temperatures=[1, 1.0]), "temperatures lists 1 more"),
        (lambda: mlxinfer.answers(model, tok, PROMPT, settings=[{}, {"top_k": 0}]), "#1 and #2 are the same"),
        (lambda: mlxinfer.settings_grid([0.5, 1], top_p=[0.9, 0.9]), "top_p lists 0.9 more"),
        # each value by its setting's rule where the grid is built (was: built, refused at its cell's run)
        (lambda: mlxinfer.settings_grid(-1), r"temperatures must be >= 0 .*, got -1$"),
        (lambda: mlxinfer.settings_grid([1, float("nan")]), r"temperatures must be >= 0 .*, got nan$"),
        (lambda: mlxinfer.settings_grid([1], top_p=[1.5]), r"top_p must be in \(0, 1\] .*, got 1.5$"),
        (
            lambda: mlxinfer.settings_grid([1], top_k=[0.5]),
            r"top_k must be a whole number .*, got 0.5 \(a float: pass an int\)$",
        ),
        # the kind named where it is the problem (was: "got '1.0'", "got 3.0" for a whole number, "got 2.5" for k
        # "between 1 and 49,152")
        (lambda: mlxinfer.settings_grid(["1.0"]), r"temperatures must be >= 0 .*, got '1.0' \(text: pass a number\)$"),
        (lambda: mlxinfer.generate(model, tok, PROMPT, max_tokens=3.0), r"got 3.0 \(a float: pass an int, 3\)$"),
        (
            lambda: mlxinfer.next_token_table(model, tok, PROMPT, k=2.5),
            r"^k must be between 1 and .*got 2.5 \(a float",
        ),
        (lambda: mlxinfer.SamplerSettings(order="foo").validate(), r"order must be .*, got 'foo'$"),  # text belongs
    ]:
        with pytest.raises(mlxinfer.MlxinferError, match=fragment):
            call()
    _, tok_again = mlxinfer.load(None, compute_dtype="bfloat16")  # the same vocabulary, another object: fine
    assert (
        mlxinfer.next_token_table(model, tok_again, PROMPT).rows == mlxinfer.next_token_table(model, tok, PROMPT).rows
    )
    with pytest.raises(mlxinfer.MlxinferError, match="compute_dtype must be"):
        mlxinfer.apply_compute_dtype(model, "fp8")  # was: nothing converted, the model relabelled
    assert model.info.compute_dtype == "quantized"
    with pytest.raises(TypeError, match=re.escape("settings={'temperature': ...}")):
        mlxinfer.generate(model, tok, PROMPT, temp=0)  # mlx-lm's old keyword: was blamed on stream_generate()


def test_a_switch_that_is_not_a_bool_is_refused_where_it_is_given(embedded_quantized):
    """Was: ChatSession(thinking="no") kept it and failed (or not) at a reply; next_token_table and
    encode_prompt read "no" as true. False itself still means off."""
    model, tok = embedded_quantized
    with pytest.raises(mlxinfer.MlxinferError, match="^thinking must be True or False, got 'no'$"):
        mlxinfer.ChatSession(model, tok, thinking="no")
    with pytest.raises(mlxinfer.MlxinferError, match="explain_sampler must be True or False"):
        mlxinfer.next_token_table(model, tok, PROMPT, explain_sampler="no")
    with pytest.raises(mlxinfer.MlxinferError, match="chat must be True or False"):
        mlxinfer.encode_prompt(tok, PROMPT, chat="no")
    plain = mlxinfer.encode_prompt(tok, PROMPT, chat=False)
    assert plain == tok.encode(PROMPT) != mlxinfer.encode_prompt(tok, PROMPT, chat=True)
    assert mlxinfer.generate(model, tok, PROMPT, chat=np.bool_(False), max_tokens=2).prompt_ids == plain  # numpy's


@pytest.mark.parametrize("ids,fragment", [([49152], "0..49,151"), ([-1], "0..49,151"), ("hi", "encode text"),
                                          ([], "empty")])  # fmt: skip
def test_token_ids_past_the_vocabulary_are_named_not_blamed_on_the_weights(embedded_quantized, ids, fragment):
    """Was: 'the forward pass gives NaN ... the weights are corrupt' for an id past the table."""
    model, tok = embedded_quantized
    encoded = tok.encode(PROMPT)  # ids already encoded, in an array, are ids
    want = mlxinfer.next_token_scores(model, encoded)
    for held in (np.array(encoded), mx.array(encoded)):
        assert mx.array_equal(mlxinfer.next_token_scores(model, held), want).item()
    for run in (mlxinfer.next_token_scores, mlxinfer.prefill):
        with pytest.raises(mlxinfer.MlxinferError, match=fragment):
            run(model, ids)


def test_tables_from_scores_take_numpy_and_lists_and_refuse_nan(embedded_quantized):
    """Was: a numpy row or a list an AttributeError; NaN scores a table of NaN; explain(scores, dict) an
    AttributeError and k=-1 a table cut short without a word."""
    model, tok = embedded_quantized
    scores = mlxinfer.next_token_scores(model, tok.encode(PROMPT))
    want = mlxinfer.table_from_scores(scores)
    got = mlxinfer.table_from_scores(np.array(scores))
    assert [r.id for r in got.rows] == [r.id for r in want.rows] and got.rows[0].probs == want.rows[0].probs
    assert [r.id for r in mlxinfer.table_from_scores([0.0, 2.0, 1.0], k=3).rows] == [1, 2, 0]
    assert [r.id for r in mlxinfer.table_from_scores(scores[None]).rows] == [r.id for r in want.rows]  # (1, V)
    as_dict = mlxinfer.explain(scores, {"temperature": 1.0, "top_k": 3})
    assert as_dict.n_kept == 3 == mlxinfer.explain(scores, mlxinfer.SamplerSettings(top_k=3)).n_kept
    for call, fragment in [
        (lambda: mlxinfer.table_from_scores([float("nan"), 1.0]), "NaN"),
        (lambda: mlxinfer.table_from_scores([]), "empty"),
        (lambda: mlxinfer.explain(scores, mlxinfer.GREEDY, k=-1), "k must be"),
        # was: a model's whole output (1, L, V) flattened into one row of L x V "tokens"
        (lambda: mlxinfer.table_from_scores(mx.stack([scores, scores])[None]), r"shape \(1, 2, 49152\)"),
        (lambda: mlxinfer.explain(mx.stack([scores, scores]), mlxinfer.GREEDY), "pass one row"),
    ]:
        with pytest.raises(mlxinfer.MlxinferError, match=fragment):
            call()


@pytest.mark.parametrize(
    "kw, param",
    [
        ({"fast_path": "no"}, "fast_path"),  # was: taken as True
        ({"llama_cpp": 0}, "llama_cpp"),
        ({"progress": 5}, "progress"),  # was: a TypeError after the models had loaded
        ({"gen_tokens": "64"}, "gen_tokens"),  # was: a TypeError comparing a str with an int
        ({"repeats": 2.0}, "repeats"),
        ({"prompt_tokens": (32, 1.5)}, "prompt_tokens"),
        ({"prompt_tokens": "64"}, "prompt_tokens"),
        ({"prompt_tokens": (32, 32)}, "prompt_tokens"),  # was: the same run twice
        ({"bandwidth_gb_s": True}, "bandwidth_gb_s"),
    ],
)
def test_benchmarks_arguments_are_checked_before_it_loads(kw, param):
    with pytest.raises(mlxinfer.MlxinferError) as e:
        mlxinfer.benchmark("/nonexistent/model", **kw)  # the argument is refused before the path is read
    assert e.value.params == (param,) and "\n" not in str(e.value)


def test_a_min_mass_below_float_epsilon_still_walks(embedded_quantized):
    """Was: min_mass=1e-17 rounded 1 - min_mass to 1, so the walk ended before its first pass with
    nothing found (and sample --exact gave each drawn answer probability 0)."""
    model, tok = embedded_quantized
    report = mlxinfer.answers(model, tok, PROMPT, settings=[{}], min_mass=1e-17, max_nodes=8, max_tokens=2)
    assert report.stopped == "min_mass" and report.answers and report.answers[0].probs[0] > 0


@pytest.mark.parametrize(
    "source, fragment",
    [
        ("embedded@bfloat16", "'@bfloat16' is no way of reading a model"),  # was: "no model at embedded@bfloat16"
        ("@float32", "'@float32' follows a model"),  # was: the embedded model, silently
        (5, "source must be a path or a hub repo id, got int"),  # was: "no model at 5"
        ("Qwen/Qwen3-0.6B@main", "a revision is not read here"),  # was: "'@main' is no way of reading a model"
    ],
)
def test_a_source_that_names_no_model_says_why(source, fragment):
    with pytest.raises(mlxinfer.MlxinferError, match=re.escape(fragment)):
        mlxinfer.load(source)


def test_smaller_entries_name_a_wrong_argument(embedded_quantized):
    """Was: fork_cache('x', 2) returned ['x'] and rows=2**40 a MemoryError; parse_rate's kind a KeyError;
    sweep(out=5) and load(group='x') a TypeError or AttributeError from deep inside."""
    model, tok = embedded_quantized
    cache = mlxinfer.prefill(model, tok.encode(PROMPT)).cache
    assert len(mlxinfer.fork_cache(cache, 2)) == len(cache)
    for call, fragment in [
        (lambda: mlxinfer.fork_cache("x", 2), "cache must be a model's cache"),
        (lambda: mlxinfer.fork_cache(cache, 2**40), "rows must be a whole number from 1 to"),
        (lambda: mlxinfer.parse_rate("5T", "bogus"), "kind must be one of 'flops', 'bandwidth'"),
        (lambda: mlxinfer.sweep(model, tok, [PROMPT], settings=[{}], seeds=1, out=5), "out must be a file's path"),
        (lambda: mlxinfer.load(None, group="x"), "group must be an mx.distributed group"),
    ]:
        with pytest.raises(mlxinfer.MlxinferError, match=re.escape(fragment)):
            call()


def test_blank_prompts_and_a_system_text_with_nowhere_to_go_are_refused_as_the_cli_refuses_them(embedded_quantized):
    """Was: "   " read as a chat message (the CLI said "--prompt is empty"); system= dropped without a word
    beside token ids or beside messages that hold a system message of their own. Plain text of white space
    is text to continue, as OpenAI's completions take it."""
    model, tok = embedded_quantized
    assert mlxinfer.generate(model, tok, "  \n", max_tokens=1, chat=False).prompt_ids == tok.encode("  \n")
    for prompt in ["   ", "\t", "  \n"]:
        for call, kw in (
            (mlxinfer.generate, dict(max_tokens=1)),
            (mlxinfer.next_token_table, {}),
            (mlxinfer.prompt_logprobs, {}),
            (mlxinfer.sample, dict(seeds=1, max_tokens=1)),
        ):
            with pytest.raises(mlxinfer.MlxinferError, match=re.escape("prompt is empty (only white space)")):
                call(model, tok, prompt, **kw)
    with pytest.raises(mlxinfer.MlxinferError, match="token ids are read as they are"):
        mlxinfer.generate(model, tok, [1, 504], system="You are a pirate.", max_tokens=1)
    messages = [{"role": "system", "content": "A"}, {"role": "user", "content": "Hi"}]
    with pytest.raises(mlxinfer.MlxinferError, match="system is given twice"):
        mlxinfer.encode_prompt(tok, messages, system="B")
    # a tool's own system text steps aside for the messages' system message, as before
    tool = {"name": "add", "description": "Add a thing", "input_schema": {"type": "object", "properties": {}}}
    g = mlxinfer.generate(model, tok, messages, tool=tool, max_tokens=2, settings=mlxinfer.GREEDY)
    assert g.prompt_ids == mlxinfer.encode_prompt(tok, messages)


def test_an_mlx_lm_users_habits_get_their_equivalent(embedded):
    """mlx-lm's model (mlx_lm.load's class, also named Model) is named with what reads it here; mlx-lm's
    generate keywords (sampler, verbose) name what takes their place; help() and completion list the
    API (generate's keywords are stream_generate's, and the lazy names are in dir())."""
    import inspect

    model, tok = embedded
    twin = mlxinfer.mlx_lm_twin(model)
    with pytest.raises(mlxinfer.MlxinferError, match=r"got mlx_lm\.models\.\w+\.Model; mlxinfer\.load\(path\)"):
        mlxinfer.generate(twin, tok, PROMPT, max_tokens=1)
    for keyword, fragment in [("sampler", "settings=SamplerSettings"), ("verbose", "result.stats")]:
        with pytest.raises(TypeError, match=re.escape(fragment)):
            mlxinfer.generate(model, tok, PROMPT, **{keyword: None})
    assert {"max_tokens", "settings", "seed", "stop"} <= set(inspect.signature(mlxinfer.generate).parameters)
    assert {"load", "generate", "stream_generate", "sample", "answers"} <= set(dir(mlxinfer))


def test_why_a_test_is_missing_is_data(embedded_quantized):
    """The CLI says why a tally has no G-test or chi-square test; the report says it too (was: only
    null values, the reason in the CLI's text alone)."""
    model, tok = embedded_quantized
    drawn = mlxinfer.sample(model, tok, PROMPT, seeds=3, max_tokens=1, exact=True, max_nodes=50)
    assert drawn.exact["p_value"] is None and drawn.exact["note"].startswith("no G-test: fewer than two groups")
    # the default batch is the CLI's, for the walk too (was: 64 paths a pass here, 32 there: other bounds reached)
    walked = [mlxinfer.sample(model, tok, PROMPT, seeds=3, max_tokens=3, exact=True, max_nodes=100, batch_size=b)
              for b in (None, 32)]  # fmt: skip
    assert walked[0].exact == walked[1].exact
    swept = mlxinfer.sweep(model, tok, [PROMPT], settings=[{"temperature": 1.0}], seeds=3, max_tokens=1)
    cell = swept.cells[0]
    assert cell.p_value is None and cell.to_dict()["test_note"].startswith("no chi-square test: fewer than two")
    many = mlxinfer.sweep(model, tok, [PROMPT], settings=[{"temperature": 0.3}], seeds=40, max_tokens=1).cells[0]
    assert many.p_value is not None and many.test_note is None


def test_a_notebook_shows_a_result_in_brief(embedded_quantized):
    """IPython showed a 6-token Generation as one 1,900-character line (every prompt id and step); it shows
    the ids' count and each field's head, while repr() and to_dict() keep everything."""
    from IPython.lib.pretty import pretty

    model, tok = embedded_quantized
    g = mlxinfer.generate(model, tok, PROMPT, max_tokens=6, seed=1)
    shown = pretty(g)
    assert shown.startswith("Generation(") and f"text={g.text!r}" in shown and "finish_reason='length'" in shown
    assert f"prompt_ids=[{len(g.prompt_ids)} ints: " in shown and len(shown) < len(repr(g)) / 1.5
    assert repr(g.prompt_ids) in repr(g)  # repr() itself unchanged
    report = mlxinfer.answers(model, tok, PROMPT, settings=[{"temperature": 1, "top_k": 3}], max_tokens=2)
    assert pretty(report).startswith("AnswersReport(") and "stopped='complete'" in pretty(report)
    drawn = mlxinfer.sample(model, tok, PROMPT, seeds=8, max_tokens=2)
    assert "completions=[8 x Completion]" in pretty(drawn)  # a list of results: its length and kind (was "8 ...s")


def test_a_reply_read_by_a_second_iterator_is_refused_and_kept_open(embedded_quantized):
    """Was: after next(iter(turn)), reply() said "iterate it to its end", and "".join(turn) (a second iterator)
    raised "call stream_generate again" and ended the reply part-way. The second iterator is refused with what to
    do, the reply stays open, and the first iterator reads it to its end. next_token_scores(tokenizer, ids) (the
    arguments as next_token_table takes them) is named, not an AttributeError inside transformers."""
    model, tok = embedded_quantized
    session = mlxinfer.ChatSession(model, tok, settings={"temperature": 0}, max_tokens=6)
    turn = session.reply("Name one fruit.")
    it = iter(turn)
    first = next(it)
    with pytest.raises(mlxinfer.MlxinferError, match="read its iterator to the end or call the reply's stop"):
        session.reply("And another?")
    with pytest.raises(mlxinfer.MlxinferError, match="being read by an iterator already: read on from that one"):
        "".join(turn)
    assert turn.record.finish_reason is None  # still open
    rest = "".join(it)
    assert turn.record.text == first + rest and turn.record.finish_reason in ("stop", "length")
    assert (
        turn.record.text
        == mlxinfer.generate(model, tok, "Name one fruit.", max_tokens=6, settings={"temperature": 0}).text
    )
    with pytest.raises(mlxinfer.MlxinferError, match="model must be the model load.. returns, got"):
        mlxinfer.next_token_scores(tok, tok.encode("hi"))


def test_a_notebook_shows_the_next_token_table_itself(embedded_quantized):
    """Was: IPython showed rows=[TokenRow(...), ...] and mass=[0.97, ...]: none of the tokens or probabilities
    the table exists for. It shows the table as `topk` prints it, each number the row's own."""
    from IPython.lib.pretty import pretty

    model, tok = embedded_quantized
    table = mlxinfer.next_token_table(model, tok, PROMPT, temperatures=[0.5, 1.0], k=4)
    lines = pretty(table).splitlines()
    assert lines[1].split() == ["#", "token", "score", "p", "@", "T=0.5", "p", "@", "T=1"]
    for row, line in zip(table.rows, lines[2:]):
        assert line.split()[0] == str(row.rank) and repr(row.text) in line
        assert line.split()[-2:] == [f"{p:.3f}" for p in row.probs] and f"{row.score:.3f}" in line
    assert lines[-1].split()[-2:] == [f"{m:.3f}" for m in table.mass] and len(lines) == 2 + len(table.rows) + 1
    assert "TokenRow(" in repr(table)  # repr() keeps everything
