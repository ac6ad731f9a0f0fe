"""`answers`: each whole answer's exact probability, checked against oracles it did not produce.

- Brute force: a tiny model over eleven words, every continuation of up to three tokens enumerated, each
  step's probability by a softmax and cuts written here in numpy (float64) from the lesson's definitions.
- mlx-lm: on the embedded model as stored, a listed path's probability at T = 1 is exp of the sum of
  mlx-lm's own log-probabilities along it.
- The sampler: 2,000 batched seeds of `sample` per setting follow the exact distribution (a G-test), and
  the same seeds drawn at another temperature (the planted bug of a temperature applied twice) do not.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict

import mlx.core as mx
import numpy as np
import pytest

import checkpoints
import mlxinfer
from mlxinfer.engine.decode import prefill
from conftest import assert_one_line_error, invoke_cli

from mlxinfer.engine import answers as answers_module
from mlxinfer.engine.branching import BRANCHES

PROMPT = "basil and"
SETTINGS = [
    {"temperature": 0.5},
    {"temperature": 1.0},
    {"temperature": 1.5},
    {"temperature": 1.0, "top_k": 3},
    {"temperature": 1.0, "top_p": 0.8},
    {"temperature": 1.0, "min_p": 0.2},
]


@pytest.fixture(scope="module")
def words(tmp_path_factory):
    path = checkpoints.write_word_checkpoint(tmp_path_factory.mktemp("words") / "words")
    return mlxinfer.load(path, compute_dtype="float32")


def reference_probs(logits: np.ndarray, s: dict) -> np.ndarray:
    """softmax(logits / T), then top-k, top-p, min-p on the tempered probabilities, rescaled to 1."""
    z = logits / s["temperature"]
    p = np.exp(z - z.max())
    p /= p.sum()
    keep = np.ones(len(p), dtype=bool)
    order = np.argsort(-p)
    if s.get("top_k"):
        keep[order[s["top_k"] :]] = False
    if s.get("top_p", 1.0) < 1.0:
        q = np.where(keep, p, 0.0) / np.where(keep, p, 0.0).sum()
        above = np.cumsum(q[order]) - q[order]  # the mass of the tokens ranked above each one
        keep[order[above >= s["top_p"]]] = False
    if s.get("min_p", 0.0) > 0:
        keep &= p >= s["min_p"] * p[keep].max()
    p = np.where(keep, p, 0.0)
    return p / p.sum()


def brute_force_paths(model, tok, settings: dict, max_tokens: int) -> dict[tuple, tuple[str, float]]:
    """Every continuation, by hand: its tokens as a draw records them (no end-of-text token) -> (its answer,
    the text stripped, and its probability)."""
    prompt = tok.encode(PROMPT)
    eos = set(tok.eos_token_ids)
    out: dict[tuple, tuple[str, float]] = {}

    def walk(prefix: list[int], p: float) -> None:
        logits = model(mx.array(prompt + prefix)[None])[0, -1].astype(mx.float32)
        for t, q in enumerate(reference_probs(np.array(logits, dtype=np.float64), settings)):
            if q == 0:
                continue
            if t in eos:
                out[tuple(prefix)] = (tok.decode(prefix).strip(), p * q)
            elif len(prefix) + 1 == max_tokens:
                out[tuple(prefix + [t])] = (tok.decode(prefix + [t]).strip(), p * q)
            else:
                walk(prefix + [t], p * q)

    walk([], 1.0)
    return out


def brute_force(model, tok, settings: dict, max_tokens: int) -> dict[str, float]:
    """Every answer (text stripped) -> its probability, the sum over its paths."""
    out: dict[str, float] = defaultdict(float)
    for answer, p in brute_force_paths(model, tok, settings, max_tokens).values():
        out[answer] += p
    return dict(out)


def test_every_answer_equals_the_brute_force_sum(words):
    model, tok = words
    report = mlxinfer.answers(
        model, tok, PROMPT, settings=SETTINGS, max_tokens=3, min_mass=1.0, group="text", chat=False
    )
    assert report.stopped == "complete"
    assert all(m.complete and m.remainder == 0 for m in report.mass)
    assert report.nodes == 1 + 10 + 10 * 10 - 1  # every open path of under 3 tokens, the root's scores free
    for s, settings in enumerate(SETTINGS):
        truth = brute_force(model, tok, settings, 3)
        got = {a.answer: a.probs[s] for a in report.answers if a.probs[s] > 0}
        assert set(got) == {k for k, v in truth.items() if v > 0}, settings
        for answer, p in truth.items():
            assert got.get(answer, 0.0) == pytest.approx(p, abs=1e-6), (settings, answer)
        assert sum(got.values()) == pytest.approx(1.0, abs=1e-6)
    cut = [m for m, s in zip(report.answers, SETTINGS) if "top_k" in s]
    assert cut  # the cut settings' supports are smaller than the vocabulary's
    top_k = SETTINGS.index({"temperature": 1.0, "top_k": 3})
    assert sum(1 for a in report.answers if a.probs[top_k] > 0) < sum(1 for a in report.answers if a.probs[1] > 0)


def test_a_stopped_walks_answers_hold_exactly_the_paths_it_ended(words):
    """A walk stopped by its budget lists each answer's mass over the paths it ended, and the report says which
    (ended_paths, as a draw records its tokens): each listed probability is the brute-force sum over those
    paths, and the remainder everything else. So a draw on an ended path has its answer's listed probability,
    one elsewhere belongs with the remainder: sample --exact's G-test counts them so (summary.walked_counts);
    counted by answer alone, an incomplete walk's answers drew more than their listed mass."""
    model, tok = words
    report = mlxinfer.answers(model, tok, PROMPT, settings=[{"temperature": 1.0}], max_tokens=3, max_nodes=10,
                              group="text", chat=False)  # fmt: skip
    assert report.stopped == "max_nodes" and report.mass[0].remainder > 0.05
    truth = brute_force_paths(model, tok, {"temperature": 1.0}, 3)
    ended = report.ended_paths
    assert ended and ended <= set(truth)
    held = defaultdict(float)
    for path in ended:
        held[truth[path][0]] += truth[path][1]
    assert {a.answer: a.probs[0] for a in report.answers} == pytest.approx(dict(held), abs=1e-6)
    assert report.mass[0].remainder == pytest.approx(1.0 - sum(held.values()), abs=1e-6)
    from mlxinfer.engine.grouping import keyer
    from mlxinfer.engine.summary import walked_counts

    some = list(truth.items())[:40]
    counts, unwalked = walked_counts([(tok.decode(list(p)), list(p)) for p, _ in some], keyer("text"), report)
    assert unwalked == sum(p not in ended for p, _ in some) and sum(counts.values()) + unwalked == len(some)


@pytest.mark.parametrize("batch_size", [3, 32])
def test_batches_fill_with_paths_of_one_length_and_change_no_answer(words, batch_size):
    """A pass runs paths of one length, so taken paths wait for a full batch of their length: the complete
    walk makes the fewest passes its tree allows (its 10 one-token, 100 two-token and 1,000 three-token
    open paths, the root's scores coming with the prompt), and every answer is the one-path-a-pass walk's
    (to 1e-6: this float32 path's BLAS rows round by the batch's size in their last bits)."""
    model, tok = words
    kw = dict(settings=SETTINGS[:2], max_tokens=4, min_mass=1.0, group="text", chat=False)
    one = {a.answer: a.probs for a in mlxinfer.answers(model, tok, PROMPT, batch_size=1, **kw).answers}
    report = mlxinfer.answers(model, tok, PROMPT, batch_size=batch_size, **kw)
    assert report.stopped == "complete" and report.nodes == 10 + 100 + 1000
    assert report.forward_passes == sum(math.ceil(n / batch_size) for n in (10, 100, 1000))
    got = {a.answer: a.probs for a in report.answers}
    assert set(got) == set(one)
    for answer, probs in got.items():
        assert probs == pytest.approx(one[answer], abs=1e-6), answer


def test_reused_path_buffers_hold_what_a_fresh_copy_holds_and_kept_positions_stay(words):
    """PathRows writes each pass's paths into the last pass's row buffers (the prompt is held once, shared):
    every filled position equals a fresh copy's, deeper and shallower passes in turn, the keys and values
    a path kept from an earlier pass are not overwritten by the next one, and a position inside the prompt
    reads the prompt's in every row."""
    from mlxinfer.engine.decode import prefill
    from mlxinfer.engine.path_cache import PathRows, at_position

    model, tok = words
    ids = tok.encode(PROMPT)
    P, B = len(ids), 4
    prompt = prefill(model, ids)
    shape = at_position(prompt.cache, P - 1)[0].shape  # (layers, 2, K, E)
    rows, kept = PathRows(prompt.cache, P), []
    for depth in (3, 1, 2, 3):
        chains = [[mx.random.normal(shape) for _ in range(depth - 1)] for _ in range(B)]
        cache = rows.cache(chains)
        fresh = PathRows(prompt.cache, P).cache(chains)
        logits = model(mx.array([[7]] * B, dtype=mx.int32), cache=cache)
        own = at_position(cache, P + depth - 1)
        inside = at_position(cache, P - 2)  # a position of the shared prompt: every row reads the prompt's
        assert mx.array_equal(inside, mx.broadcast_to(at_position(prompt.cache, P - 2), inside.shape)).item()
        mx.eval(logits, own)
        rows.keep(cache)
        filled = depth - 1  # the paths' own positions, after the prompt every row shares
        for c, f in zip(cache, fresh):
            assert c.base == P and mx.array_equal(c.prefix, f.prefix).item()
            assert mx.array_equal(c.kv[..., :filled, :], f.kv[..., :filled, :]).item()
        kept.append((own, np.array(own)))
    assert rows.kept is not None and rows.kept[0].shape[0] == B  # held for the next pass
    for own, copied in kept:
        assert (np.array(own) == copied).all()


@pytest.mark.parametrize(
    "max_nodes, batch_size, max_tokens", [(1, 32, 3), (4, 32, 3), (30, 32, 3), (30, 7, 3), (1, 32, 2)]
)
def test_a_walk_cut_short_bounds_what_it_did_not_see(words, max_nodes, batch_size, max_tokens):
    """At max_tokens 2 one pass's children all end: the budget's end resolves them with no pass."""
    model, tok = words
    report = mlxinfer.answers(
        model, tok, PROMPT, settings=SETTINGS[:3], max_tokens=max_tokens, min_mass=1.0, max_nodes=max_nodes,
        group="text", chat=False, batch_size=batch_size,
    )  # fmt: skip
    assert report.stopped == "max_nodes" and report.nodes <= max_nodes
    assert report.answers or max_tokens > 2
    for s, settings in enumerate(SETTINGS[:3]):
        truth = brute_force(model, tok, settings, max_tokens)
        got = {a.answer: a.probs[s] for a in report.answers}
        remainder = report.mass[s].remainder
        assert remainder > 0 and not report.mass[s].complete
        unlisted = sum(p for answer, p in truth.items() if answer not in got)
        assert unlisted <= remainder + 1e-6  # within the float32 scores' rounding, as every answer is
        for answer, p in got.items():  # a listed answer's probability is a lower bound, short by at most it
            assert p <= truth[answer] + 1e-6 and truth[answer] - p <= remainder + 1e-6
        assert report.mass[s].explored + remainder == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("where, nth", [("_pop", 1), ("_pop", 9), ("_pop", 60), ("_forward", 3), ("_follow", 40)])
def test_ctrl_c_inside_a_batch_still_bounds_what_was_not_seen(words, monkeypatch, where, nth):
    """Ctrl-C can land while paths are taken from the frontiers and not yet resolved (waiting for their
    batch, or in its forward pass); the report then still bounds every answer it does not list."""
    from mlxinfer.engine import answers as walk_module

    real, calls = getattr(walk_module.AnswerWalk, where), [0]

    def interrupted(self, *args):
        calls[0] += 1
        if calls[0] == nth:
            raise KeyboardInterrupt
        return real(self, *args)

    monkeypatch.setattr(walk_module.AnswerWalk, where, interrupted)
    report = mlxinfer.answers(
        model := words[0], tok := words[1], PROMPT, settings=SETTINGS[:3], max_tokens=3, min_mass=1.0,
        group="text", chat=False, batch_size=4,
    )  # fmt: skip
    assert report.stopped == "interrupted"
    for s, settings in enumerate(SETTINGS[:3]):
        truth = brute_force(model, tok, settings, 3)
        got = {a.answer: a.probs[s] for a in report.answers}
        remainder = report.mass[s].remainder
        assert sum(got.values()) + remainder >= 1.0 - 1e-9
        assert sum(p for answer, p in truth.items() if answer not in got) <= remainder + 1e-6


def test_grouping_folds_the_raw_texts_and_keeps_them(words):
    model, tok = words
    report = mlxinfer.answers(model, tok, PROMPT, settings=[SETTINGS[1]], max_tokens=3, min_mass=1.0, chat=False)
    by_text = mlxinfer.answers(
        model, tok, PROMPT, settings=[SETTINGS[1]], max_tokens=3, min_mass=1.0, chat=False, group="text"
    )
    assert report.group == "first-word" and len(report.answers) < len(by_text.answers)
    exact = {a.answer: a.probs[0] for a in by_text.answers}
    for a in report.answers:
        # this vocabulary's words are lowercase letters, so a text's first word is its first run of them
        assert all((re.findall("[a-z]+", t) or [t.strip()])[0] == a.answer for t in a.texts)
        assert a.probs[0] == pytest.approx(sum(exact[t.strip()] for t in a.texts), abs=1e-9) or a.texts_not_shown
    for a in report.answers[:3]:  # each shown path's probability is its steps' product
        for path in a.paths:
            assert math.prod(step[0] for step in path.steps) == pytest.approx(path.probs[0], rel=1e-9)


@pytest.mark.slow
def test_an_answer_lists_its_most_probable_texts_and_counts_the_rest(words, monkeypatch):
    """Was: an answer's `texts` stopped at the first 20 found, not the most probable, and nothing said that
    more existed. They are the heaviest TEXTS_SHOWN, and texts_not_shown counts the others; the report also
    names the compute path and the bounds it walked under."""
    model, tok = words
    monkeypatch.setattr(answers_module, "TEXTS_SHOWN", 2)
    report = mlxinfer.answers(model, tok, PROMPT, settings=[SETTINGS[1]], max_tokens=3, min_mass=1.0, chat=False)
    by_text = mlxinfer.answers(
        model, tok, PROMPT, settings=[SETTINGS[1]], max_tokens=3, min_mass=1.0, chat=False, group="text"
    )
    exact = {a.answer: a.probs[0] for a in by_text.answers}
    crowded = [a for a in report.answers if a.texts_not_shown]
    assert crowded
    for a in crowded:
        first_word = [exact[t] for t in exact if (re.findall("[a-z]+", t) or [t.strip()])[0] == a.answer]
        held = sorted(first_word, reverse=True)
        assert len(a.texts) == 2 and len(held) == 2 + a.texts_not_shown
        assert sorted((p[0] for p in a.texts.values()), reverse=True) == pytest.approx(held[:2], abs=1e-12)
    assert report.weights == model.info.weights and report.min_mass == 1.0 and report.max_seconds is None
    data = report.to_dict()
    assert {"weights", "min_mass", "max_seconds"} <= set(data) and "texts_not_shown" in data["answers"][0]


def test_a_listed_path_equals_mlx_lms_own_log_probabilities(embedded):
    model, tok = embedded
    prompt = "Name one herb to add to tomato soup. Answer with one word."
    report = mlxinfer.answers(model, tok, prompt, settings=[{"temperature": 1.0}], max_tokens=2, max_nodes=64)
    twin = mlxinfer.mlx_lm_twin(model)
    ids = report.prompt_ids
    checked = 0
    for answer in report.answers[:4]:
        for path in answer.paths[:2]:
            tokens = [t for t in path.tokens if t not in tok.eos_token_ids] + [
                t for t in path.tokens if t in tok.eos_token_ids
            ]
            logits = twin(mx.array(ids + tokens[:-1])[None])[0].astype(mx.float32)  # mlx-lm's class, its logits
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            ours = sum(logprobs[len(ids) - 1 + i, t].item() for i, t in enumerate(tokens))
            assert path.probs[0] == pytest.approx(math.exp(ours), rel=2e-3), (answer.answer, path.pieces)
            checked += 1
    assert checked >= 4


def test_first_token_probabilities_equal_a_float64_softmax_of_the_scores(embedded_quantized):
    """With nothing cut, each first token's probability is its float64 softmax at the temperature to ~1e-6, and
    the remainder bounds the mass of every token not listed. Was: each row's mass summed in float32 lost ~1e-4 of
    it (49,152 small terms added to a large sum), so every probability was ~1e-4 too high and the remainder too
    low to bound the rest (T = 0.5 read "complete", remainder 0, with ~6e-6 of the mass outside its tokens)."""
    model, tok = embedded_quantized
    prompt, temps = "Name one herb to add to tomato soup. Answer with one word.", [0.5, 1.0, 1.5]
    settings = [{"temperature": t} for t in temps]
    r = mlxinfer.answers(model, tok, prompt, settings=settings, max_tokens=1, group="first-token")
    ids = mlxinfer.encode_prompt(tok, prompt)
    x = np.array(prefill(model, ids).logits.reshape(-1), dtype=np.float64)  # the scores a seed's first draw reads
    for i, t in enumerate(temps):
        p = np.exp((x - x.max()) / t)
        p /= p.sum()
        listed = [a.paths[0].tokens[0] for a in r.answers if a.probs[i] > 0]
        for a in r.answers[:20]:
            assert a.probs[i] == pytest.approx(p[a.paths[0].tokens[0]], rel=2e-6, abs=1e-12), (t, a.answer)
        unlisted = 1.0 - p[listed].sum()
        assert r.mass[i].remainder >= unlisted - 1e-6, (t, r.mass[i].remainder, unlisted)  # float32's p, summed
        assert (r.mass[i].remainder == 0) == (unlisted < 1e-12)


# ----------------------------------------------------------------------------- the sampler against the truth
def g_test(counts: Counter, exact: dict[str, float], remainder: float, n: int) -> float:
    """The G-test's p-value of observed answers against the exact distribution; answers expected fewer
    than 5 times, and the remainder, pooled as "other"."""
    from scipy.stats import chi2

    bins, other_o, other_e = [], 0, n * remainder
    for answer, p in exact.items():
        if n * p >= 5:
            bins.append((counts.get(answer, 0), n * p))
        else:
            other_o, other_e = other_o + counts.get(answer, 0), other_e + n * p
    other_o += sum(k for a, k in counts.items() if a not in exact)
    bins.append((other_o, other_e))
    g = 2 * sum(o * math.log(o / e) for o, e in bins if o > 0)
    return float(chi2.sf(g, len(bins) - 1))


G_SETTINGS = [
    ({"temperature": 0.7}, {"temperature": 0.49}),  # the planted bug: a temperature applied twice (0.7 x 0.7)
    ({"temperature": 1.0, "top_p": 0.9}, None),
    ({"temperature": 1.5, "top_k": 20}, None),
]


@pytest.mark.slow
@pytest.mark.parametrize("settings, planted", G_SETTINGS, ids=["T0.7", "T1-top_p0.9", "T1.5-top_k20"])
def test_two_thousand_seeds_follow_the_exact_distribution(embedded_quantized, settings, planted):
    model, tok = embedded_quantized
    prompt = "Name one herb to add to tomato soup. Answer with one word."
    exact = mlxinfer.answers(model, tok, prompt, settings=[settings], max_tokens=4, max_nodes=2000, group="text")
    probs = {a.answer: a.probs[0] for a in exact.answers}
    remainder = exact.mass[0].remainder
    n = 2000
    report = mlxinfer.sample(model, tok, prompt, seeds=n, settings=settings, max_tokens=4, group="text")
    counts = Counter(c.text.strip() for c in report.completions)
    p = g_test(counts, probs, remainder, n)
    print(f"\n{settings}: remainder {remainder:.4f}, {len(counts)} answers drawn, G-test p = {p:.3g}")
    assert p > 1e-4
    if planted is not None:  # the same seeds drawn from a sampler with the bug: the test must see it
        wrong = mlxinfer.sample(model, tok, prompt, seeds=n, settings=planted, max_tokens=4, group="text")
        bad = g_test(Counter(c.text.strip() for c in wrong.completions), probs, remainder, n)
        print(f"with the planted bug ({planted}): G-test p = {bad:.3g}")
        assert bad < 1e-4


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"min_mass": 0}, "min_mass must be in (0, 1]"),
        ({"min_mass": 1.5}, "min_mass must be in (0, 1]"),
        ({"min_mass": float("nan")}, "min_mass must be in (0, 1]"),
        ({"max_nodes": 0}, "max_nodes must be a whole number"),
        ({"max_nodes": 2.5}, "max_nodes must be a whole number"),
        ({"max_nodes": 10**15}, "paths fit; lower it, or bound"),  # was: a walk that could never end at its bound
        ({"settings": []}, "settings must be a non-empty list"),
        ({"settings": {"temperature": 1}}, "settings must be a non-empty list"),
        ({"settings": [{"temperature": -1}]}, "temperature must be"),
        ({"max_tokens": 600}, "max_tokens"),
        ({"group": "vibes"}, "group must be one of"),
    ],
)
def test_bad_arguments_are_one_line_errors(words, kwargs, fragment):
    model, tok = words
    args = {"settings": [{"temperature": 1.0}], "max_tokens": 3, "chat": False, **kwargs}
    with pytest.raises(mlxinfer.MlxinferError, match=fragment.replace("(", r"\(").replace("]", r"\]")):
        mlxinfer.answers(model, tok, PROMPT, **args)


def test_cli_answers_prints_what_the_library_returns(words, tmp_path):
    model, tok = words
    args = ["answers", "-m", str(model.info.name), "-p", PROMPT, "--no-chat", "--temps", "0.5,1.5", "--top-k", "4",
            "--max-tokens", "2", "--min-mass", "1", "--compute-dtype", "float32"]  # fmt: skip
    done = invoke_cli(*args, "--json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    want = mlxinfer.answers(
        model, tok, PROMPT, settings=[{"temperature": t, "top_k": 4} for t in (0.5, 1.5)], max_tokens=2,
        min_mass=1.0, chat=False,
    ).to_dict()  # fmt: skip
    assert [a["answer"] for a in got["answers"]] == [a["answer"] for a in want["answers"]]
    for mine, theirs in zip(got["answers"], want["answers"]):
        assert mine["probs"] == pytest.approx(theirs["probs"], abs=1e-12)
    assert got["stopped"] == "complete" and [m["remainder"] for m in got["mass"]] == [0.0, 0.0]
    table = invoke_cli(*args)
    assert table.returncode == 0, table.stderr
    best = want["answers"][0]
    assert repr(best["answer"]) in table.stdout and f"{best['probs'][0]:.4f}" in table.stdout
    assert "(not walked: remainder)" in table.stdout
    short = invoke_cli(*[a for a in args if a not in ("--min-mass", "1")], "--max-nodes", "1")
    assert short.returncode == 0 and "stopped: max_nodes" in short.stdout, short.stderr
    assert "1 path expanded in 1 forward pass," in short.stdout  # was: "1 paths ... 1 forward passes"
    # the one path's children end at max_tokens 2 with no pass: resolved when the budget ends the walk
    assert repr(best["answer"]) in short.stdout and "no answer ended" not in short.stdout
    longer = [a for a in args if a not in ("--min-mass", "1")]
    longer[longer.index("--max-tokens") + 1] = "3"
    deeper = invoke_cli(*longer, "--max-nodes", "1")  # its children need a pass each: nothing ends
    assert (
        deeper.returncode == 0 and "no answer ended within the budget: raise --max-nodes" in deeper.stdout
    )  # was: an empty table, no word on why
    bad = [
        (["--min-mass", "0"], "--min-mass must be in (0, 1]"),
        (["--max-nodes", "-3"], "--max-nodes"),
        (["--group", "vibes"], "--group must be one of"),
        (["--temps", "hot"], "--temps takes"),
    ]
    for extra, fragment in bad:
        assert_one_line_error(invoke_cli(*args, *extra), fragment)


def test_sample_exact_sets_each_tally_row_beside_its_count(words):
    model, tok = words
    report = mlxinfer.sample(
        model, tok, PROMPT, seeds=300, settings={"temperature": 1.0}, max_tokens=3, chat=False, exact=True,
        min_mass=1.0,
    )  # fmt: skip
    # the same walk as sample's (its batch size: on the float32 path a row's bits depend on its batch)
    walk = mlxinfer.answers(model, tok, PROMPT, settings=[{"temperature": 1.0}], max_tokens=3, min_mass=1.0, chat=False,
                            batch_size=report.batch_size)  # fmt: skip
    probs = {a.answer: a.probs[0] for a in walk.answers}
    drawn = [row for row in report.tally if row.count]
    assert sum(row.count for row in drawn) == 300
    for row in report.tally:
        assert row.exact == pytest.approx(probs[row.answer], abs=1e-12)
        assert row.share_low <= row.share <= row.share_high
    assert report.exact["remainder"] == 0.0 and report.exact["complete"]
    assert report.exact["p_value"] is not None and report.exact["p_value"] > 1e-4
    assert any(row.count == 0 for row in report.tally)  # the likeliest answers no seed drew are listed too
    for row in drawn:  # the raw texts a grouped row holds, and their counts
        assert sum(row.texts.values()) == row.count


def test_sweep_exact_records_and_cells(words, tmp_path):
    model, tok = words
    out = tmp_path / "r.jsonl"
    report = mlxinfer.sweep(
        model, tok, [PROMPT, "thyme"], settings=[{"temperature": 1.0}, {"temperature": 0.5}], seeds=40, max_tokens=2,
        chat=False, exact=True, min_mass=1.0, out=out,
    )  # fmt: skip
    lines = [json.loads(line) for line in out.read_text().splitlines()[1:]]
    assert len(lines) == 2 * 2 * 40 and all("exact_prob" in r for r in lines)
    for cell in report.cells:
        walk = mlxinfer.answers(
            model, tok, [PROMPT, "thyme"][cell.prompt_index], settings=[cell.settings], max_tokens=2, min_mass=1.0,
            chat=False,
        )  # fmt: skip
        probs = {a.answer: a.probs[0] for a in walk.answers}
        assert {a.answer: a.exact for a in cell.answers} == pytest.approx(
            {a.answer: probs[a.answer] for a in cell.answers}
        )
        assert cell.exact["remainder"] == 0.0
    plain = mlxinfer.sweep(
        model,
        tok,
        [PROMPT],
        settings=[{"temperature": 1.0}],
        seeds=4,
        max_tokens=2,
        chat=False,
        out=tmp_path / "p.jsonl",
    )
    assert plain.cells[0].exact is None
    assert all("exact_prob" not in json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()[1:])


def test_ctrl_c_in_the_walk_of_sample_sweep_and_answers_stops_the_command(words, tmp_path, monkeypatch):
    """Was: Ctrl-C during `sample --exact` / `sweep --exact` was taken by the walk (its Ctrl-C returns what it
    found), the seeds were drawn anyway and every record kept a cut-short walk's probabilities (most 0.0), exit
    0; `answers` at Ctrl-C exited 0 too. Now the interrupt stops sample and sweep (no file), and `answers`
    prints what it found and exits 130."""
    from mlxinfer.engine import answers as walk_module

    real, calls = walk_module.AnswerWalk.step, [0]

    def interrupted(self):
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(walk_module.AnswerWalk, "step", interrupted)
    model, tok = words
    common = dict(settings={"temperature": 1.0}, max_tokens=3, chat=False, exact=True, min_mass=1.0)
    with pytest.raises(KeyboardInterrupt):
        mlxinfer.sample(model, tok, PROMPT, seeds=20, **common)
    calls[0], out = 0, tmp_path / "r.jsonl"
    with pytest.raises(KeyboardInterrupt):
        mlxinfer.sweep(model, tok, [PROMPT], seeds=20, out=out, **{**common, "settings": [common["settings"]]})
    assert not out.exists() and list(tmp_path.iterdir()) == []  # nothing drawn, nothing written
    from mlxinfer.engine.results import Terminated

    def terminated(self):  # SIGTERM under sweep's handler: the command's exit code (143) comes through the walk
        raise Terminated(143)

    monkeypatch.setattr(walk_module.AnswerWalk, "step", terminated)
    with pytest.raises(Terminated) as e:
        mlxinfer.sweep(model, tok, [PROMPT], seeds=20, out=out, **{**common, "settings": [common["settings"]]})
    assert e.value.exit_code == 143 and not out.exists()
    monkeypatch.setattr(walk_module.AnswerWalk, "step", interrupted)
    calls[0] = 0
    args = ["answers", "-m", str(model.info.name), "-p", PROMPT, "--no-chat", "--max-tokens", "3", "--min-mass", "1",
            "--compute-dtype", "float32", "--batch-size", "2"]  # fmt: skip
    shown = invoke_cli(*args)
    assert shown.returncode == 130 and "stopped: interrupted" in shown.stdout, (shown.returncode, shown.stderr)


def test_ctrl_c_during_samples_draws_keeps_the_seeds_that_finished(words, monkeypatch):
    """Was: Ctrl-C while `sample` drew exited 130 with nothing on stdout or stderr, every finished seed lost. The
    seeds that finished are kept (the same texts an uninterrupted run gives them), the report says how many, and
    the CLI prints them, names the interruption on stderr and exits 130. --csv with --exact is refused (it had
    printed the plain rows and dropped the exact figures)."""
    from mlxinfer.engine import experiments

    model, tok = words
    common = dict(settings={"temperature": 1.0}, max_tokens=3, chat=False)
    whole = {c.seed: c.text for c in mlxinfer.sample(model, tok, PROMPT, seeds=20, **common).completions}
    real = experiments.prefill_and_decode

    def cut_short(*args, **kwargs):
        finished = 0
        for live, step in real(*args, **kwargs):
            yield live, step
            finished += step.token is None
            if finished == 5:
                raise KeyboardInterrupt

    monkeypatch.setattr(experiments, "prefill_and_decode", cut_short)
    report = mlxinfer.sample(model, tok, PROMPT, seeds=20, batch_size=4, **common)
    assert report.interrupted == "5 of 20 seeds finished" and len(report.completions) == 5
    assert all(c.text == whole[c.seed] for c in report.completions)
    assert sum(row.count for row in report.tally) == 5
    args = ["sample", "-m", str(model.info.name), "-p", PROMPT, "--no-chat", "--seeds", "20", "--max-tokens", "3",
            "--temp", "1", "--compute-dtype", "float32"]  # fmt: skip
    shown = invoke_cli(*args)
    assert shown.returncode == 130 and "5 draws" in shown.stdout, (shown.returncode, shown.stderr)
    assert "interrupted: 5 of 20 seeds finished" in shown.stderr
    assert_one_line_error(invoke_cli(*args, "--csv", "--exact"), "no place for --exact")


def test_cli_answers_marks_an_unfinished_walks_probabilities_as_lower_bounds(words):
    """A walk stopped by --max-nodes printed what it had found as if exact ('the' 0.0497 where the first token alone
    has 0.18). Such a column's values are lower bounds: marked, with what would make them exact; a complete walk's
    are not marked."""
    model, _ = words
    base = ["answers", "-m", str(model.info.name), "-p", PROMPT, "--no-chat", "--temps", "0.5,1.5", "--max-tokens", "2",
            "--compute-dtype", "float32"]  # fmt: skip
    cut = invoke_cli(*base, "--max-nodes", "2")
    assert cut.returncode == 0 and "stopped: max_nodes" in cut.stdout, cut.stderr
    rows = [line for line in cut.stdout.splitlines() if line.startswith("│ '")]
    assert rows and all(line.count("≥") == 2 for line in rows), cut.stdout
    assert "≥: at least" in cut.stdout and "--max-nodes" in cut.stdout
    whole = invoke_cli(*base, "--top-k", "4", "--min-mass", "1")
    assert whole.returncode == 0 and "stopped: complete" in whole.stdout, whole.stderr
    assert "│ '" in whole.stdout and "≥" not in whole.stdout


def test_a_walk_bounded_by_time_may_name_any_number_of_paths(words):
    """max_nodes past the machine's memory is refused only where nothing else bounds the walk."""
    model, tok = words
    report = mlxinfer.answers(model, tok, PROMPT, settings=[{"temperature": 1.0}], max_tokens=3, chat=False,
                              max_nodes=10**15, max_seconds=0.2)  # fmt: skip
    assert report.stopped in ("max_seconds", "complete", "min_mass")


def test_a_time_budget_spent_in_the_prompts_prefill_ends_the_walk_there(embedded_quantized):
    """A long prompt (four 512-token prefill chunks) and 0.05 s: the walk used to prefill all of it, then drain
    the root's children past its budget (a server's 60 s walk took 82 s). It stops after the chunk that spent the
    budget, with nothing walked and the whole mass as its remainder."""
    model, tok = embedded_quantized
    prompt = "One herb, then another herb. " * 250
    assert len(tok.encode(prompt)) > 3 * 512
    report = mlxinfer.answers(model, tok, prompt, settings=[{"temperature": 1.0}], max_tokens=1, chat=False,
                              max_seconds=0.05)  # fmt: skip
    assert report.stopped == "max_seconds" and report.answers == [] and report.nodes == 0
    assert report.mass[0].remainder == 1.0 and not report.mass[0].complete


def test_scores_that_turn_nan_on_a_path_end_the_walk_in_one_line(tmp_path):
    """A forward pass on a path (not the prompt, which prefill checks) that gives NaN: the walk's own check."""
    model, tok = mlxinfer.load(checkpoints.write_word_checkpoint(tmp_path / "words"), compute_dtype="float32")
    poisoned = tok.encode(" thyme", add_special_tokens=False)
    assert len(poisoned) == 1 and poisoned[0] not in tok.encode(PROMPT, add_special_tokens=False)
    table = model.model.embed_tokens.weight
    model.model.embed_tokens.weight = mx.where(mx.arange(table.shape[0])[:, None] == poisoned[0], mx.nan, table)
    with pytest.raises(mlxinfer.MlxinferError, match="scores became NaN or inf on an answer's path"):
        mlxinfer.answers(model, tok, PROMPT, settings=[{"temperature": 1.0}], max_tokens=3, chat=False)


def test_a_walk_that_ends_short_of_min_mass_on_its_branch_cap_says_so(embedded_quantized):
    """T = 1.5 and no cut: one token's 1,024 likeliest next tokens hold ~0.77 of its mass, so nothing is open
    and min_mass 0.99 is not resolved. It said "min_mass"; it says "branches", and the remainder is the rest."""
    model, tok = embedded_quantized
    r = mlxinfer.answers(
        model, tok, "Name one fruit. Answer with one word.", settings=[{"temperature": 1.5}], max_tokens=1,
        group="first-token",
    )  # fmt: skip
    found = sum(a.probs[0] for a in r.answers)
    assert r.stopped == "branches" and found < 0.99, (r.stopped, found)
    assert len(r.answers) <= BRANCHES
    assert abs(found + r.mass[0].remainder - 1.0) < 1e-9
    again = mlxinfer.answers(
        model, tok, "Name one fruit. Answer with one word.", settings=[{"temperature": 1.5}], max_tokens=1,
        group="first-token", min_mass=0.5,
    )  # fmt: skip
    assert again.stopped == "min_mass"


def test_a_hot_setting_beside_a_cold_one_does_not_starve_it(embedded_quantized):
    """T = 0.3 alone resolves 0.99 of its mass in well under 300 paths. Beside T = 1.5 (whose thousands of light
    short paths filled every pass) it resolved nothing in 300; the walk now runs the pass that resolves the most
    probability, so the cold setting gets as far as it does alone, in either order."""
    model, tok = embedded_quantized
    herb = "Name one herb to add to tomato soup. Answer with one word."
    alone = mlxinfer.answers(model, tok, herb, settings=[{"temperature": 0.3}], max_tokens=4, max_nodes=300)
    assert alone.stopped == "min_mass" and alone.nodes < 150, (alone.stopped, alone.nodes)
    for pair in ([0.3, 1.5], [1.5, 0.3]):
        r = mlxinfer.answers(model, tok, herb, settings=[{"temperature": t} for t in pair], max_tokens=4, max_nodes=300)
        cold = r.mass[pair.index(0.3)]
        assert cold.explored >= 0.95, (pair, cold)


def test_a_drawn_answer_the_walk_did_not_reach_has_no_exact_probability_not_zero(embedded_quantized):
    """T = 1.5, one token, no cut: the walk ends on its branch cap with a remainder, and answers some seed drew
    lie past it. Their exact probability was shown as 0.00%; it is None (at most the remainder), and the
    CLI shows "<= remainder"."""
    model, tok = embedded_quantized
    prompt = "Name one fruit. Answer with one word."
    report = mlxinfer.sample(
        model, tok, prompt, seeds=30, settings={"temperature": 1.5}, max_tokens=1, group="first-token", exact=True
    )
    remainder = report.exact["remainder"]
    unreached = [row for row in report.tally if row.exact is None]
    assert remainder > 0.1 and unreached and all(row.count > 0 for row in unreached)
    assert all(row.exact > 0 for row in report.tally if row.exact is not None)
    shown = invoke_cli("sample", "-p", prompt, "--temp", "1.5", "--max-tokens", "1", "--group", "first-token",
                       "--seeds", "30", "--exact")  # fmt: skip
    assert f"<= {remainder:.2%}" in shown.stdout
    reached = [row for row in report.tally if row.exact is not None]  # lower bounds, marked as `answers` marks them
    assert all(f"≥{row.exact:.2%}" in shown.stdout for row in reached) and "≥: at least" in shown.stdout


def test_first_token_groups_keep_apart_tokens_that_decode_alike(embedded_quantized):
    """Tokens that are parts of one character each decode to U+FFFD: first-token grouping merged them into one
    answer. They now keep their ids; a whole token is its text alone."""
    from mlxinfer.engine.grouping import answer_key

    _, tok = embedded_quantized
    decode = lambda t: tok.decode([t])  # noqa: E731
    halves = [t for t in range(200) if "\ufffd" in decode(t)][:2]
    assert len(halves) == 2
    keys = {answer_key("", t, "first-token", decode) for t in halves}
    assert keys == {f"\ufffd #{t}" for t in halves}
    basil = tok.encode(" basil", add_special_tokens=False)[0]
    assert answer_key("", basil, "first-token", decode) == decode(basil)


def test_first_token_answers_hold_their_first_tokens_mass_alone(embedded_quantized):
    """Was: the walk summed answers by their text, then named each text's mass after one of its paths' first
    tokens, so tokens whose rows end with the same text ('"' and ' "', or three part-character tokens) were
    one answer with all their mass. One token a path: each first-token answer's probability is the softmax of
    the model's own scores summed over the tokens with its key, no other (the walk takes the likeliest
    BRANCHES tokens)."""
    from mlxinfer.engine.grouping import answer_key

    model, tok = embedded_quantized
    prompt = "Reply with a single emoji."
    r = mlxinfer.answers(model, tok, prompt, settings=[{"temperature": 1.0}], max_tokens=1, group="first-token")
    ids = mlxinfer.encode_prompt(tok, prompt)
    scores = np.array(model(mx.array([ids]))[0, -1].astype(mx.float32), dtype=np.float64)
    p = np.exp(scores - scores.max())
    p /= p.sum()
    want = defaultdict(float)
    for t in np.argsort(-p)[:BRANCHES]:
        want[answer_key("", int(t), "first-token", lambda i: tok.decode([i]))] += p[t]
    assert sum("#" in a.answer for a in r.answers) >= 3  # part-character tokens, each its own answer
    for a in r.answers:
        assert a.probs[0] == pytest.approx(want[a.answer], rel=1e-3, abs=1e-7), a.answer  # one pass against the walk's


def test_answers_takes_temps_or_temp_not_both():
    """Was: --temps 0.5 --temp 1 ran at T = 1 alone, --temps dropped without a word."""
    assert_one_line_error(invoke_cli("answers", "-p", "hi", "--temps", "0.5", "--temp", "1"), "--temps", "--temp")


def test_a_pass_larger_than_the_machines_memory_is_refused_before_it_runs(words, monkeypatch):
    """Was: `answers --batch-size 1000000` ended in a segmentation fault with nothing printed, and `sample
    --seeds 100000 --batch-size 100000` in numpy's "Unable to allocate 18.3 GiB" traceback. A pass's rows each
    hold their scores over the vocabulary: past this machine's memory, one line first.
    (The memory is made small here, so that a small model's pass is too large for it.)"""
    from mlxinfer.model import dtype_rule

    model, tok = words
    V = model.config.vocab_size
    monkeypatch.setattr(dtype_rule, "physical_ram_bytes", lambda: 10 * 4 * 4 * V)  # 10 rows' scores
    with pytest.raises(mlxinfer.MlxinferError, match=r"a pass of 16 rows would need .* at most 10 rows fit; lower "
                       r"batch_size") as e:  # fmt: skip
        mlxinfer.sample(model, tok, PROMPT, seeds=16, max_tokens=3, chat=False)
    assert e.value.params == ("batch_size",)
    assert len(mlxinfer.sample(model, tok, PROMPT, seeds=16, max_tokens=3, chat=False, batch_size=10).completions) == 16
    with pytest.raises(mlxinfer.MlxinferError, match=r"a pass of 12 rows .* at most 10 rows fit"):
        mlxinfer.answers(model, tok, PROMPT, settings=[{"temperature": 1.0}], max_tokens=3, chat=False,
                         batch_size=12)  # fmt: skip


@pytest.mark.parametrize("command", ["sample", "sweep"])
def test_a_walk_bound_without_exact_is_refused_not_ignored(command, tmp_path):
    """Was: sample and sweep took --min-mass, --max-nodes and --max-seconds without --exact and did nothing with
    them; the user thought the walk bounded. Refused before the model loads, nothing written."""
    out = tmp_path / "r.jsonl"
    where = ["--out", str(out)] if command == "sweep" else []
    for flag, value in (("--min-mass", "0.5"), ("--max-nodes", "5"), ("--max-seconds", "3")):
        shown = invoke_cli(command, "-p", "x", "--seeds", "2", flag, value, *where)
        assert_one_line_error(shown, flag, "add it")
    assert not out.exists()
    assert invoke_cli(command, "-p", "x", "--seeds", "2", "--max-tokens", "1", *where).returncode == 0


def test_a_remainder_too_small_for_four_places_is_not_shown_as_zero():
    """0.0000 is a complete walk's remainder; 2e-8 left by --min-mass 0.99999 printed the same."""
    from mlxinfer_cli.commands.answers import _remainder

    assert [_remainder(r) for r in (0.0, 2.03e-8, 4.9e-5, 0.1234)] == ["0.0000", "2.0e-08", "4.9e-05", "0.1234"]
