"""topk: the lesson's next-token table, checked against mlx-lm's forward pass and softmax identities."""

from __future__ import annotations

import itertools
import json
import math

import mlx.core as mx
import pytest
from conftest import assert_one_line_error, invoke_cli

from mlxinfer.tokenizer import encode_prompt

HERB = "Name one herb to add to tomato soup. Answer with one word."


@pytest.fixture(scope="module")
def herb_table():
    out = invoke_cli("topk", "-p", HERB, "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.slow
def test_embedded_herb_table(herb_table, embedded):
    _, tokenizer = embedded
    t = herb_table
    assert t["n_scores"] == 49152  # one score per vocabulary entry
    assert t["prompt_ids"] == encode_prompt(tokenizer, HERB)
    assert t["temperatures"] == [0.5, 1.0, 1.5] and len(t["rows"]) == 6
    scores = [r["score"] for r in t["rows"]]
    assert scores == sorted(scores, reverse=True)
    for j, temp in enumerate(t["temperatures"]):
        assert t["mass"][j] == pytest.approx(sum(r["probs"][j] for r in t["rows"]), abs=1e-6)
        # the lesson's gap rule: the ratio of two probabilities is exp(gap / T)
        a, b = t["rows"][0], t["rows"][1]
        assert a["probs"][j] / b["probs"][j] == pytest.approx(math.exp((a["score"] - b["score"]) / temp), rel=1e-4)
    # lower temperature concentrates mass on the top token; higher spreads it
    top = [p for p in t["rows"][0]["probs"]]
    assert top[0] > top[1] > top[2]
    assert t["rows"][0]["logprob"] == pytest.approx(math.log(t["rows"][0]["probs"][1]), abs=1e-5)


def test_topk_scores_equal_mlx_lm_forward(checkpoint_dir):
    import mlx_lm

    path = checkpoint_dir("qwen3", 4, 128)
    out = json.loads(
        invoke_cli(
            "topk", "-m", str(path), "-p", "Name one fruit.", "--rows", "8", "--compute-dtype", "bfloat16", "--json"
        ).stdout
    )
    peer, tok = mlx_lm.load(str(path))
    scores = peer(mx.array([out["prompt_ids"]]))[0, -1].astype(mx.float32)
    top = mx.argsort(-scores)[:8].tolist()
    assert [r["id"] for r in out["rows"]] == top
    probs = mx.softmax(scores / 1.5).tolist()
    for r in out["rows"]:
        assert r["score"] == scores[r["id"]].item()
        assert r["probs"][2] == pytest.approx(probs[r["id"]], rel=1e-5)


def test_explain_top_p_keeps_the_smallest_set(checkpoint_dir):
    # --top-k 0 switches off the top-k 20 that the checkpoint's generation_config.json sets
    path = str(checkpoint_dir("llama"))
    out = json.loads(
        invoke_cli(
            "topk",
            "-m",
            path,
            "-p",
            "hi",
            "--temp",
            "1.0",
            "--top-p",
            "0.3",
            "--top-k",
            "0",
            "--explain",
            "--rows",
            "384",
            "--json",
        ).stdout
    )
    ex = out["explanation"]
    kept = [r for r in ex["rows"] if r["kept"]]
    assert ex["n_kept"] == len(kept) >= 1
    mass = sum(r["prob"] for r in kept)
    assert mass == pytest.approx(ex["mass_kept"], abs=1e-6) and mass >= 0.3
    assert mass - kept[-1]["prob"] < 0.3  # smallest such set: without its last token it falls short
    # the running total the lesson's worked example reads: the last kept row is the first to reach p
    assert [r["running"] for r in ex["rows"][:3]] == pytest.approx(
        list(itertools.accumulate(r["prob"] for r in ex["rows"][:3]))
    )
    reached = next(r for r in ex["rows"] if r["running"] >= 0.3)
    assert reached["rank"] == kept[-1]["rank"] == len(kept)
    assert sum(r["final_prob"] for r in kept) == pytest.approx(1.0, abs=1e-5)
    assert "set by you" in out["settings_note"]


def test_explain_says_how_many_kept_tokens_it_does_not_show(checkpoint_dir):
    path = str(checkpoint_dir("llama"))
    args = ["topk", "-m", path, "-p", "hi", "--temp", "1.0", "--top-k", "9", "--top-p", "1", "--explain"]
    assert "3 more kept tokens are not shown (--rows 10 shows them)" in invoke_cli(*args, "--rows", "6").stdout
    assert "more kept tokens" not in invoke_cli(*args, "--rows", "10").stdout


def test_thinking_switch_reaches_the_chat_template(checkpoint_dir):
    """Qwen3's enable_thinking: off (the lessons' setting) adds the empty think block to the prompt."""
    path = str(checkpoint_dir("qwen3"))
    args = ("topk", "-m", path, "-p", "Name one fruit.", "--rows", "1", "--json")
    off = json.loads(invoke_cli(*args, "--no-thinking").stdout)["prompt_ids"]
    on = json.loads(invoke_cli(*args, "--thinking").stdout)["prompt_ids"]
    import mlxinfer

    _, tok = mlxinfer.load(path)
    think = tok.convert_tokens_to_ids("<think>")
    assert think in off and think not in on
    assert off[: len(on)] == on  # the same prompt, plus the think block


# ----------------------------------------------------------------------------- what the terminal shows
@pytest.mark.slow
def test_the_table_make_run_prints(herb_table):
    """`make run`'s table on the float32 path: the header, then each row's rank, token, id, score and
    probabilities as --json gives them, in order, and the mass footer."""
    out = invoke_cli("topk", "-p", HERB)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("SmolLM2-135M-Instruct (Q4_1 GGUF, embedded default)  prompt: 44 tokens")
    # which definition ran, on which compute path (the weights as this load holds them)
    path = json.loads(invoke_cli("topk", "-p", HERB, "--json").stdout)["weights"]
    assert lines[1] == f"scores in one pass of mlxinfer llama on {path} weights: 49,152" and "quantized" in path
    header = next(line for line in lines if "p @ T=0.5" in line)
    assert ["#", "token", "id", "score", "p @ T=0.5", "p @ T=1", "p @ T=1.5"] == [
        c.strip() for c in header.strip("┃").split("┃")
    ]
    rows = [[c.strip() for c in line.strip("│").split("│")] for line in lines if line.startswith("│")]
    for row, want in zip(rows, herb_table["rows"]):
        assert row == [
            str(want["rank"]),
            repr(want["text"]),
            str(want["id"]),
            f"{want['score']:.2f}",
            *(f"{p:.3f}" for p in want["probs"]),
        ]
    assert rows[len(herb_table["rows"])] == ["", "top rows hold", "", "", *(f"{m:.3f}" for m in herb_table["mass"])]


def test_thinking_on_a_template_without_the_switch_is_refused():
    """Was: --thinking was accepted and did nothing on a chat template that has no enable_thinking."""
    assert_one_line_error(invoke_cli("topk", "-p", "Name one fruit.", "--thinking"), "--thinking does nothing here")
    assert_one_line_error(invoke_cli("topk", "-p", "Name one fruit.", "--thinking", "--no-chat"), "--no-chat skips")


def test_system_and_tool_with_no_chat_are_refused():
    """Was: --no-chat dropped --system and --tool without a word, so the model never saw them."""
    assert_one_line_error(
        invoke_cli("topk", "-p", "Name one fruit.", "--system", "Be brief.", "--no-chat"), "--no-chat skips"
    )
    tool = '{"name": "pick", "input_schema": {"type": "object"}}'
    out = invoke_cli("generate", "-p", "Name one fruit.", "--tool", tool, "--no-chat", "--max-tokens", "2")
    assert_one_line_error(out, "--tool is described to the model", "--json-schema")


def test_explain_shows_the_tables_probabilities_and_masses_within_0_and_1(embedded):
    """explain() read MLX's CPU softmax, off by ~1.5e-4 on 49,152 tokens: mass_kept 1.0000368, mass_cut
    -3.7e-5, each prob above the table's. It now shows the table's float64 values; the kept set stays the
    sampler's."""
    import mlxinfer
    from mlxinfer.engine.tables import next_token_scores

    model, tok = embedded
    prompt = "Name one fruit. Answer with one word."
    scores = next_token_scores(model, encode_prompt(tok, prompt))
    for temperature, top_p in [(1.0, 1.0), (0.7, 0.9), (1.5, 1.0)]:
        e = mlxinfer.explain(scores, mlxinfer.SamplerSettings(temperature=temperature, top_p=top_p), k=4)
        table = mlxinfer.next_token_table(model, tok, prompt, temperatures=[temperature], k=4)
        assert [r.prob for r in e.rows] == [r.probs[0] for r in table.rows]
        assert 0 < e.mass_kept <= 1 and e.mass_cut >= 0 and abs(e.mass_kept + e.mass_cut - 1) < 1e-12
        kept = [r.final_prob for r in e.rows if r.kept]
        assert all(abs(f - r.prob / e.mass_kept) < 1e-12 for f, r in zip(kept, e.rows))


def test_explain_totals_are_what_top_p_reads_or_absent(checkpoint_dir):
    """In mlx-lm's order top-p reads the untempered row: the total is at T = 1 there, and its first row to
    reach p is the last kept; after a top-k cut top-p reads the survivors rescaled, which the column is not,
    so it is left out (None)."""
    path = str(checkpoint_dir("llama"))
    run = ["topk", "-m", path, "-p", "hi", "--explain", "--rows", "384", "--json", "--temp", "0.3"]
    ex = json.loads(invoke_cli(*run, "--order", "mlx-lm", "--top-p", "0.5", "--top-k", "0").stdout)["explanation"]
    kept = [r for r in ex["rows"] if r["kept"]]
    reached = next(r for r in ex["rows"] if r["running"] >= 0.5)
    assert reached["rank"] == kept[-1]["rank"] == len(kept) and reached["prob"] != reached["running"]
    ex = json.loads(invoke_cli(*run, "--top-k", "8", "--top-p", "0.8").stdout)["explanation"]
    assert all(r["running"] is None for r in ex["rows"])


@pytest.mark.parametrize(
    "penalties",
    [{"repetition_penalty": 3.0}, {"presence_penalty": 2.0, "frequency_penalty": 1.5}],
)
def test_explain_applies_the_penalties_it_shows(checkpoint_dir, penalties):
    """The penalties read the prompt's tokens (as a draw of generate's first token reads them): worked by
    hand from the raw scores, mlx-lm's repetition rule and OpenAI's presence and frequency terms."""
    import numpy as np

    import mlxinfer

    model, tok = mlxinfer.load(str(checkpoint_dir("llama")))
    prompt = "hi hi hi there hi"
    settings = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "penalty_window": 64, **penalties}
    k = model.config.vocab_size  # every row: the penalized tokens among them
    table = mlxinfer.next_token_table(model, tok, prompt, k=k, chat=False, settings=settings)
    ids = table.prompt_ids
    x = np.array(mlxinfer.next_token_scores(model, ids), dtype=np.float64)
    counts = {t: ids.count(t) for t in set(ids)}
    for t, n in counts.items():
        if "repetition_penalty" in penalties:
            p = penalties["repetition_penalty"]
            x[t] = x[t] / p if x[t] > 0 else x[t] * p
        else:
            x[t] -= penalties["presence_penalty"] + penalties["frequency_penalty"] * n
    want = np.exp(x - x.max())
    want /= want.sum()
    rows = table.explanation.rows
    assert [r.id for r in rows] == list(np.argsort(-x, kind="stable"))
    assert [r.prob for r in rows] == pytest.approx(want[[r.id for r in rows]], abs=2e-6)
    assert [r.final_prob for r in rows] == pytest.approx(want[[r.id for r in rows]], abs=2e-6)
