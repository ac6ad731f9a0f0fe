"""A prompt read token by token (prompt_logprobs, `mlxinfer tokens`): against mlx-lm's own logits,
and against scoring each prefix on its own."""

from __future__ import annotations

import json
import math

import mlx.core as mx
import pytest

import mlxinfer
from mlxinfer.engine import reading
from conftest import assert_one_line_error, invoke_cli

TEXT = "The capital of France is Paris. The capital of Italy is Rome, and the capital of Spain is Madrid."


def test_each_tokens_probability_is_mlx_lms(embedded):
    """On the weights as stored, every token's log-probability is mlx-lm's (its model class, one pass over
    the whole text), the best guess is its argmax, and the perplexity is exp of their mean."""
    model, tok = embedded
    got = mlxinfer.prompt_logprobs(model, tok, TEXT, chat=False, top=2)
    ids = [t.id for t in got.tokens]
    assert ids == tok.encode(TEXT) and got.scored == len(ids) - 1 and got.tokens[0].logprob is None
    logits = mlxinfer.mlx_lm_twin(model)(mx.array(ids)[None])[0].astype(mx.float32)
    theirs = (logits - mx.logsumexp(logits, axis=-1, keepdims=True)).tolist()
    for t in got.tokens[1:]:
        row = theirs[t.position - 1]
        assert t.logprob == pytest.approx(row[t.id], abs=2e-3), (t.position, t.text)
        ordered = sorted(range(len(row)), key=lambda i: -row[i])
        if row[ordered[0]] - row[ordered[1]] > 0.01:  # no near tie: the same first guess
            assert t.alternatives[0].id == ordered[0]
        above, near = sum(v > row[t.id] + 2e-3 for v in row), sum(v > row[t.id] - 2e-3 for v in row)
        assert above + 1 <= t.rank <= near + 1, (t.position, t.rank, above, near)  # its rank, up to near ties
    mean = sum(theirs[t.position - 1][t.id] for t in got.tokens[1:]) / got.scored
    assert got.perplexity == pytest.approx(math.exp(-mean), rel=2e-3)
    assert got.first_guesses == sum(t.rank == 1 for t in got.tokens[1:])


def test_a_long_prompt_in_chunks_scores_as_each_prefix_alone(embedded_quantized, monkeypatch):
    """Reading in chunks through the KV cache gives position i the bits that scoring the prefix ids[:i]
    in one pass gives it (the native path computes each position alone), across the chunks' seams."""
    model, tok = embedded_quantized
    monkeypatch.setattr(reading, "CHUNK", 16)
    got = mlxinfer.prompt_logprobs(model, tok, TEXT, chat=False, top=3)
    ids = [t.id for t in got.tokens]
    for i in (1, 15, 16, 17, len(ids) - 1):
        alone = mlxinfer.next_token_scores(model, ids[:i])
        lp = mlxinfer.sampler.log_softmax(alone, model.info.cpu_kernels)  # the reading's own
        assert got.tokens[i].logprob == lp[ids[i]].item()
        assert [a.id for a in got.tokens[i].alternatives] == mx.argsort(-alone)[:3].tolist()
        assert got.tokens[i].rank == mx.sum(alone > alone[ids[i]]).item() + 1


def test_tokens_command_prints_the_library_reading_and_refuses_bad_input(embedded_quantized):
    model, tok = embedded_quantized
    shown = json.loads(invoke_cli("tokens", "-p", TEXT, "--no-chat", "--top", "2", "--json").stdout)
    assert shown == mlxinfer.prompt_logprobs(model, tok, TEXT, chat=False, top=2).to_dict()
    table = invoke_cli("tokens", "-p", "The capital of France", "--no-chat").stdout
    assert "' France'" in table and "perplexity" in table
    one = invoke_cli("tokens", "-p", "x", "--no-chat")
    assert one.returncode == 0 and "nothing to score" in one.stdout
    assert_one_line_error(invoke_cli("tokens", "-p", "x", "--top", "21"), "--top")
    too_long = "word " * (model.config.max_position_embeddings + 10)
    assert_one_line_error(invoke_cli("tokens", "-p", too_long, "--no-chat"), "context")
    with pytest.raises(mlxinfer.MlxinferError, match="top must be"):
        mlxinfer.prompt_logprobs(model, tok, TEXT, top=-1)
