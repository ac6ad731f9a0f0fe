"""Generation: seeded parity with mlx-lm, greedy identities, streaming text, stats, bad input."""

from __future__ import annotations

import json
import re

import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_one_line_error, invoke_cli

import mlxinfer
from mlxinfer import GREEDY, SamplerSettings
from mlxinfer.errors import MlxinferError
from mlxinfer.tokenizer import encode_prompt

HERB = "Name one herb to add to tomato soup. Answer with one word."
FRUIT = "Name one fruit. Answer with one word."
LLAMA_CPP_FRUIT = "The fruit I'm referring to is the fruit of the blackcurrant, which is a type of citrus fruit."


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_seeded_draws_equal_mlx_lm(embedded_fast, temperature):
    """Ten seeds, the lesson's experiment, one at a time on the float32 path: our completions are
    mlx-lm's (its generate after mx.random.seed(s), on the same model), token for token."""
    from mlx_lm import generate as mlx_lm_generate
    from mlx_lm.sample_utils import make_sampler as mlx_lm_sampler

    model, tokenizer = embedded_fast
    report = mlxinfer.sample(
        model, tokenizer, HERB, seeds=10, settings=SamplerSettings(temperature=temperature), max_tokens=4, batch_size=1
    )
    ids = encode_prompt(tokenizer, HERB)
    for c in report.completions:
        mx.random.seed(c.seed)
        theirs = mlx_lm_generate(model, tokenizer, ids, max_tokens=4, sampler=mlx_lm_sampler(temp=temperature))
        assert c.text == theirs, c.seed
    assert sum(t.count for t in report.tally) == 10
    assert len(report.tally) > 1  # at T >= 0.7 ten draws do not all agree on this prompt


@pytest.mark.slow
def test_same_seed_same_text(embedded_fast):
    model, tokenizer = embedded_fast
    a = mlxinfer.sample(model, tokenizer, FRUIT, seeds=[5, 7], settings={"temperature": 1.0}, max_tokens=4)
    b = mlxinfer.sample(model, tokenizer, FRUIT, seeds=[7], settings={"temperature": 1.0}, max_tokens=4)
    assert a.completions[1].tokens == b.completions[0].tokens
    one = mlxinfer.generate(model, tokenizer, FRUIT, settings={"temperature": 1.0}, max_tokens=4, seed=7)
    assert one.tokens == b.completions[0].tokens  # generate's seed is sample's seed


@pytest.mark.slow
def test_finish_reasons_stats_and_greedy_settings(embedded_fast):
    """A cut answer's finish reason and stats; token ids as the prompt give the same tokens; and greedy
    is greedy whatever else is set: temperature 0 (with a top-p cut) and top-k 1 at temperature 1.5
    (seeded) decode GREEDY's tokens. (The whole greedy answer, llama.cpp's, is test_blas's: there both
    paths decode it to its end-of-turn token; the command line's is test_generate_streams_the_text...)"""
    model, tokenizer = embedded_fast
    ids = encode_prompt(tokenizer, FRUIT)
    cut = mlxinfer.generate(model, tokenizer, FRUIT, settings=GREEDY, max_tokens=6)
    assert cut.finish_reason == cut.stats.finish_reason == "length"
    assert cut.stats.generated_tokens == 6 == len(cut.tokens) and cut.stats.prompt_tokens == len(ids)
    assert cut.stats.prefill_tokens_per_s > 0 and cut.stats.decode_tokens_per_s > 0
    assert cut.stats.peak_memory_bytes > 0
    assert cut.tokens == tokenizer.encode(LLAMA_CPP_FRUIT)[:6]
    assert mlxinfer.generate(model, tokenizer, ids, settings=GREEDY, max_tokens=6).tokens == cut.tokens  # ids too
    for settings in (SamplerSettings(temperature=0.0, top_p=0.5), SamplerSettings(temperature=1.5, top_k=1)):
        assert mlxinfer.generate(model, tokenizer, FRUIT, settings=settings, max_tokens=6, seed=3).tokens == cut.tokens


@pytest.mark.slow
def test_stream_generate_yields_what_generate_returns(embedded_fast):
    model, tokenizer = embedded_fast
    stream = mlxinfer.stream_generate(model, tokenizer, FRUIT, settings={"temperature": 0.9}, max_tokens=8, seed=5)
    steps = list(stream)
    assert steps[-1].token is None and steps[-1].finish_reason == stream.result.finish_reason
    assert steps[-1].logprob is None  # no token: no probability (was 0.0, a p of 1)
    assert all(s.finish_reason is None and s.logprob < 0 for s in steps[:-1])
    assert "".join(s.text for s in steps) == stream.result.text
    whole = mlxinfer.generate(model, tokenizer, FRUIT, settings={"temperature": 0.9}, max_tokens=8, seed=5)
    assert whole.tokens == [s.token for s in steps[:-1]] and whole.text == stream.result.text


def test_logprobs_are_log_softmax(embedded_fast):
    model, tokenizer = embedded_fast
    ids = encode_prompt(tokenizer, FRUIT)
    result = mlxinfer.generate(model, tokenizer, ids, settings=GREEDY, max_tokens=2, logprobs=3)
    scores = np.array(model(mx.array([ids]))[0, -1].astype(mx.float32)).astype(np.float64)
    expected = scores - (scores.max() + np.log(np.exp(scores - scores.max()).sum()))  # in float64
    first = result.steps[0]
    assert first.alternatives[0].id == first.token  # greedy picks the best alternative
    assert first.logprob == pytest.approx(expected[first.token], abs=1e-4)
    for alt in first.alternatives:
        assert alt.logprob == pytest.approx(expected[alt.id], abs=1e-4)


@pytest.mark.parametrize(
    "text", ["naïve café, déjà vu", "日本語のテキスト", "emoji 😀🍅 and  two  spaces", " leading space\nnew line"]
)
def test_streaming_detokenizer_reassembles_text(embedded, text):
    """Streamed pieces join to exactly the decoded text: no broken UTF-8, no lost spaces."""
    _, tokenizer = embedded
    tokens = tokenizer.encode(text)
    detok = tokenizer.detokenizer
    detok.reset()
    pieces = []
    for t in tokens:
        detok.add_token(t)
        pieces.append(detok.last_segment)
    detok.finalize()
    pieces.append(detok.last_segment)
    assert "\ufffd" not in "".join(pieces)
    expected = tokenizer.decode(tokens)
    if expected.startswith(" "):  # an answer's first space is dropped, as mlx-lm's streamer does
        expected = expected[1:]
    assert "".join(pieces) == expected


def test_generation_config_defaults_and_overrides(checkpoint_dir):
    path = str(checkpoint_dir("qwen3"))
    default = json.loads(
        invoke_cli("generate", "-m", path, "-p", "hi", "--max-tokens", "2", "--seed", "1", "--json").stdout
    )
    assert default["settings"]["temperature"] == 0.6 and default["settings"]["top_k"] == 20
    assert default["settings"]["top_p"] == 0.95 and "generation_config.json" in default["settings_note"]
    mine = json.loads(
        invoke_cli("generate", "-m", path, "-p", "hi", "--max-tokens", "2", "--temp", "0.9", "--json").stdout
    )
    assert mine["settings"]["temperature"] == 0.9 and mine["settings"]["top_k"] == 20
    assert "set by you" in mine["settings_note"]


def test_llama_cpp_flags_for_the_penalty_window_and_top_k_off(checkpoint_dir):
    """--repeat-last-n (llama.cpp's; --penalty-window) gives the library's penalty_window, and it matters;
    --top-k -1 is off, as llama.cpp and vLLM take it (the model's top-k 20 does not apply)."""
    path = str(checkpoint_dir("qwen3"))
    run = ["generate", "-m", path, "-p", "The cat", "-n", "12", "--seed", "3", "--temp", "1", "--top-p", "1"]
    run += ["--repetition-penalty", "3", "--json"]
    out = json.loads(invoke_cli(*run, "--repeat-last-n", "2", "--top-k", "-1").stdout)
    assert out["settings"]["penalty_window"] == 2 and out["settings"]["top_k"] == 0
    model, tok = mlxinfer.load(path)
    settings = SamplerSettings(temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=3.0, penalty_window=2)
    assert out["text"] == mlxinfer.generate(model, tok, "The cat", settings=settings, max_tokens=12, seed=3).text
    whole = json.loads(invoke_cli(*run, "--top-k", "0").stdout)["text"]
    assert whole != out["text"]


def test_sample_cli_json_and_csv(checkpoint_dir):
    path = str(checkpoint_dir("llama"))
    out = invoke_cli("sample", "-m", path, "-p", "hi", "--seeds", "4", "--temp", "1.0", "--max-tokens", "3", "--json")
    data = json.loads(out.stdout)
    assert [c["seed"] for c in data["completions"]] == [0, 1, 2, 3]
    assert sum(t["count"] for t in data["tally"]) == 4
    assert abs(sum(t["share"] for t in data["tally"]) - 1.0) < 1e-9
    assert data["max_tokens"] == 3 and data["stop"] == []  # was: the budget the completions ran under was missing
    assert all(len(c["tokens"]) <= 3 for c in data["completions"])
    csv_out = invoke_cli(
        "sample", "-m", path, "-p", "hi", "--seed-range", "2:4", "--temp", "1.0", "--max-tokens", "3", "--csv"
    )
    rows = csv_out.stdout.strip().splitlines()
    assert rows[0] == "seed,text,finish_reason" and len(rows) == 3


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["generate", "--temp", "-1"], ["error: --temp must be >= 0"]),
        (["generate", "--top-p", "1.5"], ["error: --top-p must be in (0, 1]"]),
        (["generate", "--top-p", "0"], ["--top-p"]),
        (["generate", "--top-k", "-2"], ["error: --top-k must be"]),
        (["generate", "--min-p", "1"], ["error: --min-p must be"]),
        (["generate", "--max-tokens", "0"], ["error: --max-tokens must be", "got 0"]),
        (["generate", "--max-tokens", "abc"], ["--max-tokens", "not a valid integer"]),
        (["generate", "--logprobs", "-1"], ["error: --logprobs must be"]),
        (["sample", "--seed-range", "5:2"], ["error: --seed-range 5:2 is empty"]),
        (["sample", "--seeds", "0"], ["error: --seeds must be at least 1"]),
        (["sample", "--seeds", "3", "--batch-size", "0"], ["error: --batch-size must be"]),
        (["topk", "--rows", "0"], ["error: --rows must be between"]),
        (["topk", "-k", "0"], ["error: -k must be between"]),
        (["topk", "--temps", "-0.5"], ["error: --temps must be >= 0"]),
        (["topk", "--temps", "nan"], ["error: --temps must be >= 0", "nan"]),
        (["topk", "--temps", "inf"], ["error: --temps must be >= 0", "and finite", "inf"]),  # was: ">= 0, got inf"
        (["topk", "--temps", "a,b"], ["--temps takes numbers"]),
    ],
)
def test_bad_sampling_input(checkpoint_dir, args, fragments):
    """The terminal names the flag the user typed."""
    result = invoke_cli(*args, "-m", str(checkpoint_dir("llama")), "-p", "hi")
    assert_one_line_error(result, *fragments)


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda m, t: mlxinfer.generate(m, t, "hi", max_tokens=0),
            "max_tokens must be a whole number, at least 1, got 0",
        ),
        (lambda m, t: mlxinfer.generate(m, t, "hi", settings={"temperature": -1}), "temperature must be >= 0"),
        (lambda m, t: mlxinfer.generate(m, t, "hi", settings={"temp": 1}), "unknown sampling setting(s) temp"),
        (lambda m, t: mlxinfer.generate(m, t, "hi", seed=-3), "seed must be a whole number >= 0"),
        (lambda m, t: mlxinfer.generate(m, t, [1, 10**9]), "prompt token ids must be whole numbers in 0.."),
        (lambda m, t: mlxinfer.generate(m, t, "", chat=False), "prompt is empty"),
        (lambda m, t: mlxinfer.generate(m, t, ""), "prompt is empty"),  # was: a reply to the template alone
        (lambda m, t: mlxinfer.next_token_table(m, t, ""), "prompt is empty"),
        (lambda m, t: mlxinfer.generate(m, t, [1] * 512, max_tokens=1), "leaving no room"),  # was: "lower
        # max_tokens to at most 0"; the tiny checkpoint's context is 512
        (lambda m, t: mlxinfer.sample(m, t, "hi", seeds="5:2"), "seeds 5:2 is empty or reversed"),
        (lambda m, t: mlxinfer.sample(m, t, "hi", seeds="-3:2"), "seeds -3:2 starts below 0"),  # was: "reversed"
        (lambda m, t: mlxinfer.sample(m, t, "hi", seeds=3, batch_size=0), "batch_size must be a whole number"),
        (lambda m, t: mlxinfer.next_token_table(m, t, "hi", k=0), "k must be between 1 and"),
        (lambda m, t: mlxinfer.next_token_table(m, t, "hi", temperatures=[float("nan")]), "temperatures must be >= 0"),
    ],
)
def test_bad_input_in_python_names_the_parameter(loaded, call, message):
    """The library's message names its parameter; the CLI's (above) names the flag."""
    model, tokenizer = loaded("llama")
    with pytest.raises(MlxinferError) as info:
        call(model, tokenizer)
    assert str(info.value).startswith(message) or message in str(info.value), str(info.value)
    assert "--" not in str(info.value) and "\n" not in str(info.value)


def test_prompt_longer_than_context(checkpoint_dir):
    long_prompt = "tomato soup " * 400  # the tiny checkpoint's context is 512 positions
    for command in ("topk", "generate"):
        result = invoke_cli(command, "-m", str(checkpoint_dir("llama")), "-p", long_prompt)
        assert_one_line_error(result, "context", "shorten")
    # a short prompt with a budget beyond the context: lower --max-tokens, not "shorten the prompt"
    result = invoke_cli("generate", "-m", str(checkpoint_dir("llama")), "-p", "hi", "--max-tokens", "10000000")
    assert_one_line_error(result, "context is 512", "lower --max-tokens to at most")


@pytest.mark.slow
def test_penalised_generation_equals_mlx_lm(embedded_fast):
    """The history our loop hands to the penalties is mlx-lm's: same greedy tokens with a repetition penalty."""
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_logits_processors as mlx_lm_processors

    model, tokenizer = embedded_fast
    ids = encode_prompt(tokenizer, "Repeat after me: tomato tomato tomato tomato tomato")
    settings = SamplerSettings(temperature=0.0, repetition_penalty=1.8, penalty_window=20)
    ours = mlxinfer.generate(model, tokenizer, ids, settings=settings, max_tokens=12).tokens
    plain = mlxinfer.generate(model, tokenizer, ids, settings=GREEDY, max_tokens=12).tokens
    theirs = [
        t
        for t, _ in generate_step(
            mx.array(ids),
            model,
            max_tokens=12,
            logits_processors=mlx_lm_processors(repetition_penalty=1.8, repetition_context_size=20),
        )
    ]
    theirs = theirs[: len(ours)]
    assert ours == theirs
    assert ours != plain[: len(ours)]  # the penalty changed the text, so the comparison means something


# ----------------------------------------------------------------------------- what the terminal shows
def test_sample_prints_each_seed_then_the_tally(checkpoint_dir):
    path = str(checkpoint_dir("llama"))
    args = ("sample", "-m", path, "-p", "hi", "--seeds", "6", "--temp", "1.5", "--max-tokens", "2")
    data = json.loads(invoke_cli(*args, "--json").stdout)
    out = invoke_cli(*args)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert data["settings_note"] in " ".join(out.stdout.split())  # rich wraps it at the terminal's width
    first = next(i for i, line in enumerate(lines) if line.startswith("seed "))
    assert lines[first : first + 6] == [f"seed {c['seed']:>4}: {c['text']!r}" for c in data["completions"]]
    assert any(line.strip() == "6 draws" for line in lines)
    rows = [[c.strip() for c in line.strip("│").split("│")] for line in lines if line.startswith("│")]
    assert rows == [[repr(t["answer"]), str(t["count"]), f"{t['share']:.1%}"] for t in data["tally"]]


@pytest.mark.slow
def test_generate_streams_the_text_then_one_stats_line(embedded_fast):
    out = invoke_cli("generate", "-p", FRUIT, "--temp", "0", "--max-tokens", "40", "--compute-dtype", "float32")
    assert out.returncode == 0, out.stderr
    assert out.stdout == LLAMA_CPP_FRUIT + "\n"
    import re

    note, stats = out.stderr.strip().splitlines()
    assert note.startswith(
        "[SmolLM2-135M-Instruct (Q4_1 GGUF, embedded default) on mlxinfer llama] sampling: temperature 0.0"
    )
    assert re.fullmatch(
        r"prompt 39 tokens at [\d.]+ tok/s \| generated 23 tokens at [\d.]+ tok/s \| "
        r"peak memory \d+ MB \| finish: stop",
        stats,
    ), stats
    # one token: it came with the prefill, no decode step was timed (was "generated 1 token at 0.0 tok/s")
    one = invoke_cli("generate", "-p", FRUIT, "--temp", "0", "--max-tokens", "1", "--compute-dtype", "float32")
    assert one.returncode == 0 and "| generated 1 token with the prefill |" in one.stderr, one.stderr


def test_seeds_read_a_count_as_python_reads_a_whole_number():
    """--seeds N reads N as the other whole-number options do (Python's int: '1_000'), and A:B as before;
    what int() refuses, or a digit outside ASCII, is the one-line message."""
    from mlxinfer.engine.request import seed_list

    for text in ("1_000", " 12 ", "+4", "7"):
        assert seed_list(text) == list(range(int(text)))
    assert seed_list("3:1_0") == list(range(3, 10))
    for text in ("1__0", "1e3", "\u00b2", "12 seeds"):
        with pytest.raises(MlxinferError, match="seeds takes N or A:B"):
            seed_list(text)


@pytest.mark.slow
def test_the_table_generate_and_tokens_give_one_probability(embedded_quantized):
    """topk's table, generate's logprobs and tokens' reading say one log-probability for the same token
    after the same prompt, on the default path. The oracle: numpy's float64 log-softmax of the model's scores.
    MLX's CPU softmax and logsumexp were 1.5e-4 off on this row, which set the table and tokens apart from
    generate (the as-stored path keeps them: its logprobs are mlx-lm's own)."""
    model, tok = embedded_quantized
    ids = mlxinfer.encode_prompt(tok, FRUIT)
    scores = np.asarray(mlxinfer.next_token_scores(model, ids), dtype=np.float64)
    truth = scores - scores.max() - np.log(np.sum(np.exp(scores - scores.max())))
    best = mlxinfer.next_token_table(model, tok, FRUIT, temperatures=[1.0], k=3).rows[0]
    assert best.logprob == pytest.approx(truth[best.id], abs=1e-6)
    assert best.probs[0] == pytest.approx(np.exp(truth[best.id]), rel=1e-6)
    step = mlxinfer.generate(model, tok, FRUIT, settings={"temperature": 0.0}, max_tokens=1, logprobs=1).steps[0]
    assert step.token == best.id and step.logprob == pytest.approx(truth[best.id], abs=2e-5)
    read = mlxinfer.prompt_logprobs(model, tok, ids + [best.id])
    assert read.tokens[-1].logprob == pytest.approx(truth[best.id], abs=2e-5)


@pytest.mark.slow
def test_topk_explain_keeps_what_the_sampler_draws_on_int8():
    """topk's table reads the scores every draw reads (the prompt prefilled into a cache): the tokens
    --explain keeps and their rescaled probabilities are those of the exact walk over one token, which
    reads the engine's own prefill. On int8 a pass without the cache had put a fourth token in the cut
    (scores up to 0.8 apart)."""
    model, tok = mlxinfer.load(None, compute_dtype="int8")
    settings = {"temperature": 1.0, "top_p": 0.392, "top_k": 0, "min_p": 0.0}
    table = mlxinfer.next_token_table(model, tok, FRUIT, settings=settings, k=20)
    kept = {r.id: r.final_prob for r in table.explanation.rows if r.kept}
    walk = mlxinfer.answers(model, tok, FRUIT, settings=[settings], max_tokens=1, group="text")
    assert walk.stopped == "complete"
    walked = {p.tokens[0]: p.probs[0] for a in walk.answers for p in a.paths}
    assert set(kept) == set(walked)
    assert all(kept[t] == pytest.approx(walked[t], abs=1e-6) for t in kept)
    scores = mlxinfer.next_token_scores(model, mlxinfer.encode_prompt(tok, FRUIT))
    assert mx.array_equal(scores, mlxinfer.prefill(model, mlxinfer.encode_prompt(tok, FRUIT)).logits[0]).item()


def test_generate_logprobs_lists_each_alternative_whole_and_says_which_probabilities_they_are(monkeypatch):
    """At 60 columns the alternatives column folded inside a token and between a token and its logprob, and the
    table did not say that its numbers are the model's own at T = 1 (they are, under --temp 0 and any cut)."""
    monkeypatch.setenv("COLUMNS", "60")
    shown = invoke_cli("generate", "-p", "Name one fruit.", "--temp", "0.5", "--top-k", "2", "--seed", "1",
                       "--logprobs", "3", "--max-tokens", "2")  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "the model's own (T = 1, nothing cut)" in shown.stdout
    cells = [line.split("│")[4].strip() for line in shown.stdout.splitlines() if line.count("│") == 5]
    alternatives = [c for c in cells if c]
    assert len(alternatives) == 6 and all(re.fullmatch(r"'.*' -?\d+\.\d{3}", c) for c in alternatives), cells
    table = mlxinfer.next_token_table(*mlxinfer.load(), "Name one fruit.", temperatures=[1.0], k=3)
    assert alternatives[:3] == [f"{r.text!r} {r.logprob:.3f}" for r in table.rows]


def test_generate_logprobs_names_the_token_drawn_not_the_text_it_completed():
    """Was: the token column showed each step's streamed text, so a space held back behind the next token read
    '' on its own row and ' 2' on the next, against alternatives ' ' and '2'. At T = 0 the token drawn is the
    first alternative, and its own text is what the column and the JSON's token_text say."""
    args = ("generate", "-p", "The capital of France is", "--no-chat", "--temp", "0", "--max-tokens", "12",
            "--logprobs", "1")  # fmt: skip
    shown = invoke_cli(*args)
    assert shown.returncode == 0, shown.stderr
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in shown.stdout.splitlines() if line.count("│") == 5]
    assert len(rows) == 12 and all(r[3].startswith(r[0] + " ") for r in rows), rows
    steps = json.loads(invoke_cli(*args, "--json").stdout)["steps"]
    tok = mlxinfer.load()[1]
    assert [s["token_text"] for s in steps] == [tok.decode([s["token"]]) for s in steps]
    assert any(s["token_text"] != s["text"] for s in steps)  # a step whose text the stream held back


def test_generate_without_a_seed_draws_one_and_shows_it_so_the_text_can_be_repeated():
    """Was: no --seed drew from MLX's global stream and --json said "seed": null, so a text worth keeping could
    not be had again. The CLI draws a seed below 2**32, as chat does, and shows it; the library's generate keeps
    mlx-lm's meaning of None (the global stream)."""
    args = ("generate", "-p", "Name one fruit.", "--temp", "1.5", "-n", "8")
    first = invoke_cli(*args, "--json")
    assert first.returncode == 0, first.stderr
    drawn = json.loads(first.stdout)
    assert isinstance(drawn["seed"], int) and 0 <= drawn["seed"] < 2**32
    again = json.loads(invoke_cli(*args, "--seed", str(drawn["seed"]), "--json").stdout)
    assert again["text"] == drawn["text"] and again["tokens"] == drawn["tokens"]
    shown = invoke_cli(*args)
    assert re.search(r"\] \[seed \d+\] ", shown.stderr), shown.stderr


def test_a_generations_steps_join_to_its_text(embedded):
    """Was: the detokenizer's last piece (a space held back behind the last token) was in the text and in no step,
    so a 20-token greedy reply to 'The capital of France is' ended its text with '22 ' and its last step with ''.
    The kept steps now join to the text; the streamed steps, the final one included, did and still do."""
    model, tok = embedded
    stream = mlxinfer.stream_generate(model, tok, "The capital of France is", chat=False, settings=GREEDY,
                                      max_tokens=20, logprobs=1)  # fmt: skip
    streamed = [s.text for s in stream]
    result = stream.result
    assert "".join(streamed) == result.text
    assert "".join(s.text for s in result.steps) == result.text and result.text != result.text.rstrip()
    assert streamed[: len(result.steps) - 1] == [s.text for s in result.steps[:-1]]


def test_a_greedy_generation_reports_no_seed(embedded_quantized):
    """Was: `generate --temp 0 --json` reported a fresh random seed each run (2694535391, then 1026885794), though
    greedy decoding draws nothing and the text output shows none; a sampled one reports the seed it drew from."""
    model, tok = embedded_quantized
    greedy = mlxinfer.generate(model, tok, "hi", max_tokens=2, seed=5, settings={"temperature": 0})
    drawn = mlxinfer.generate(model, tok, "hi", max_tokens=2, seed=5, settings={"temperature": 1})
    assert greedy.seed is None and drawn.seed == 5
    shown = json.loads(invoke_cli("generate", "-p", "hi", "--temp", "0", "--max-tokens", "2", "--json").stdout)
    assert shown["seed"] is None, shown
