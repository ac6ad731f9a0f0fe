"""Generation: seeded parity with mlx-lm, greedy identities, streaming text, stats, bad input."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from conftest import assert_one_line_error, invoke_cli

import mlxinfer
from mlxinfer.experiments import sample_seeds
from mlxinfer.generate import Stats, collect, generate_steps, greedy
from mlxinfer.sampler import SamplerSettings, make_sampler
from mlxinfer.tokenizer import encode_prompt

HERB = "Name one herb to add to tomato soup. Answer with one word."
FRUIT = "Name one fruit. Answer with one word."


@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_seeded_draws_equal_mlx_lm(embedded_fast, temperature):
    """Ten seeds, the lesson's experiment: our completions are mlx-lm's, token for token."""
    from mlx_lm import generate as mlx_lm_generate
    from mlx_lm.sample_utils import make_sampler as mlx_lm_sampler

    model, tokenizer = embedded_fast
    report = sample_seeds(model, tokenizer, HERB, range(10), SamplerSettings(temperature=temperature), max_tokens=4)
    ids = encode_prompt(tokenizer, HERB)
    for c in report.completions:
        mx.random.seed(c.seed)
        theirs = mlx_lm_generate(model, tokenizer, ids, max_tokens=4, sampler=mlx_lm_sampler(temp=temperature))
        assert c.text == theirs, c.seed
    assert sum(t.count for t in report.tally) == 10
    assert len(report.tally) > 1  # at T >= 0.7 ten draws do not all agree on this prompt


def test_same_seed_same_text(embedded_fast):
    model, tokenizer = embedded_fast
    settings = SamplerSettings(temperature=1.0)
    a = sample_seeds(model, tokenizer, FRUIT, [7, 7], settings, max_tokens=4)
    assert a.completions[0].tokens == a.completions[1].tokens


def _run(model, tokenizer, ids, sample, n=6, **kw):
    stats = Stats()
    return collect(generate_steps(model, tokenizer, ids, sample, max_tokens=n, stats=stats, **kw), stats)


def test_greedy_equals_temperature_zero_and_top_k_one(embedded_fast):
    model, tokenizer = embedded_fast
    ids = encode_prompt(tokenizer, FRUIT)
    base = _run(model, tokenizer, ids, greedy).tokens
    mx.random.seed(3)
    assert _run(model, tokenizer, ids, make_sampler(SamplerSettings(temperature=0.0, top_p=0.5))).tokens == base
    mx.random.seed(3)
    assert _run(model, tokenizer, ids, make_sampler(SamplerSettings(temperature=1.5, top_k=1))).tokens == base


def test_finish_reasons_and_stats(embedded_fast):
    model, tokenizer = embedded_fast
    ids = encode_prompt(tokenizer, FRUIT)
    cut = _run(model, tokenizer, ids, greedy, n=3)
    assert cut.stats.finish_reason == "length" and cut.stats.generated_tokens == 3 == len(cut.tokens)
    assert cut.stats.prompt_tokens == len(ids)
    assert cut.stats.prefill_tokens_per_s > 0 and cut.stats.decode_tokens_per_s > 0
    assert cut.stats.peak_memory_bytes > 0
    full = _run(model, tokenizer, ids, greedy, n=40)
    assert full.stats.finish_reason == "stop"  # the end-of-turn token, not counted as text
    assert full.text == "The fruit I'm referring to is the fruit of the blackcurrant, which is a type of citrus fruit."


def test_logprobs_are_log_softmax(embedded_fast):
    model, tokenizer = embedded_fast
    ids = encode_prompt(tokenizer, FRUIT)
    result = _run(model, tokenizer, ids, greedy, n=2, logprobs=3)
    scores = model(mx.array([ids]))[0, -1].astype(mx.float32)
    expected = (scores - mx.logsumexp(scores)).tolist()
    first = result.steps[0]
    assert first.alternatives[0]["id"] == first.token  # greedy picks the best alternative
    for alt in first.alternatives:
        assert alt["logprob"] == pytest.approx(expected[alt["id"]], abs=1e-4)


@pytest.mark.parametrize("text", ["naïve café, déjà vu", "日本語のテキスト", "emoji 😀🍅 and  two  spaces", " leading space\nnew line"])
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
    default = json.loads(invoke_cli("generate", "-m", path, "-p", "hi", "--max-tokens", "2", "--seed", "1", "--json").stdout)
    assert default["settings"]["temperature"] == 0.6 and default["settings"]["top_k"] == 20
    assert default["settings"]["top_p"] == 0.95 and "generation_config.json" in default["settings"]["note"]
    mine = json.loads(
        invoke_cli("generate", "-m", path, "-p", "hi", "--max-tokens", "2", "--temp", "0.9", "--json").stdout
    )
    assert mine["settings"]["temperature"] == 0.9 and mine["settings"]["top_k"] == 20
    assert "set by you" in mine["settings"]["note"]


def test_sample_cli_json_and_csv(checkpoint_dir):
    path = str(checkpoint_dir("llama"))
    out = invoke_cli("sample", "-m", path, "-p", "hi", "--seeds", "4", "--temp", "1.0", "--max-tokens", "3", "--json")
    data = json.loads(out.stdout)
    assert [c["seed"] for c in data["completions"]] == [0, 1, 2, 3]
    assert sum(t["count"] for t in data["tally"]) == 4
    assert abs(sum(t["share"] for t in data["tally"]) - 1.0) < 1e-9
    csv_out = invoke_cli("sample", "-m", path, "-p", "hi", "--seed-range", "2:4", "--temp", "1.0", "--max-tokens", "3", "--csv")
    rows = csv_out.stdout.strip().splitlines()
    assert rows[0] == "seed,text,finish_reason" and len(rows) == 3


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["generate", "--temp", "-1"], ["temperature"]),
        (["generate", "--top-p", "1.5"], ["top_p"]),
        (["generate", "--top-p", "0"], ["top_p"]),
        (["generate", "--top-k", "-2"], ["top_k"]),
        (["generate", "--min-p", "1"], ["min_p"]),
        (["generate", "--max-tokens", "0"], ["max-tokens"]),
        (["sample", "--seed-range", "5:2"], ["seed-range"]),
        (["sample", "--seeds", "0"], ["seeds"]),
        (["topk", "-k", "0"], ["-k"]),
        (["topk", "--temps", "-0.5"], ["temperature"]),
    ],
)
def test_bad_sampling_input(checkpoint_dir, args, fragments):
    result = invoke_cli(*args, "-m", str(checkpoint_dir("llama")), "-p", "hi")
    assert_one_line_error(result, *fragments)


def test_prompt_longer_than_context(checkpoint_dir):
    long_prompt = "tomato soup " * 400  # the tiny checkpoint's context is 512 positions
    for command in ("topk", "generate"):
        result = invoke_cli(command, "-m", str(checkpoint_dir("llama")), "-p", long_prompt)
        assert_one_line_error(result, "context", "shorten")


def test_penalised_generation_equals_mlx_lm(embedded_fast):
    """The history our loop hands to the penalties is mlx-lm's: same greedy tokens with a repetition penalty."""
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_logits_processors as mlx_lm_processors

    from mlxinfer.sampler import make_logits_processors

    model, tokenizer = embedded_fast
    ids = encode_prompt(tokenizer, "Repeat after me: tomato tomato tomato tomato tomato")
    settings = SamplerSettings(temperature=0.0, repetition_penalty=1.8, penalty_window=20)
    ours = _run(model, tokenizer, ids, greedy, n=12, processors=make_logits_processors(settings)).tokens
    plain = _run(model, tokenizer, ids, greedy, n=12).tokens
    theirs = [t for t, _ in generate_step(mx.array(ids), model, max_tokens=12,
                                          logits_processors=mlx_lm_processors(repetition_penalty=1.8, repetition_context_size=20))]
    theirs = theirs[: len(ours)]
    assert ours == theirs
    assert ours != plain[: len(ours)]  # the penalty changed the text, so the comparison means something
