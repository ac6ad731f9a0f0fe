"""`quality`'s numbers against numpy on the same logits: KL(reference || candidate), top-1 agreement and
perplexity, computed here in float64 from each model's float32 scores over the same windows."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np
import pytest

from mlxinfer.errors import MlxinferError
from mlxinfer.model.convert import to_float32
from mlxinfer_quant import QualityProgress, evaluate
from mlxinfer_quant.export import load

TEXT = "The cat sat on the mat. Thyme, basil, dill, oregano, rosemary. Apple, mango, banana, cherry, grape. " * 3


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    top = x.max(axis=-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("window", [16, 7])
def test_kl_top1_and_perplexity_equal_numpys(checkpoint_dir, tmp_path, window):
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    reference, candidate = checkpoint_dir("llama"), checkpoint_dir("llama", 4, 64)
    seen: list[QualityProgress] = []
    report = evaluate(reference, [candidate], max_tokens=50, window=window, text=text, progress=seen.append)

    ids = load(reference)[1].encode(TEXT)[:50]
    windows = [w for w in (ids[i : i + window] for i in range(0, len(ids), window)) if len(w) >= 2]
    lps = []
    for source in (reference, candidate):
        model = to_float32(load(source)[0])  # as evaluate runs every model
        lps.append([_log_softmax(np.array(model(mx.array([w]))[0, :-1].astype(mx.float32))) for w in windows])
    targets = [np.array(w[1:]) for w in windows]
    positions = sum(len(t) for t in targets)
    nll = [-sum(lp[np.arange(len(t)), t].sum() for lp, t in zip(model_lps, targets)) for model_lps in lps]
    kl = np.concatenate([(np.exp(r) * (r - c)).sum(axis=-1) for r, c in zip(*lps)])
    agree = sum((r.argmax(-1) == c.argmax(-1)).sum() for r, c in zip(*lps))

    assert report.tokens == len(ids) and report.positions == positions
    assert report.reference.perplexity == pytest.approx(math.exp(nll[0] / positions), rel=1e-4)
    (row,) = report.candidates
    assert row.perplexity == pytest.approx(math.exp(nll[1] / positions), rel=1e-4)
    assert row.kl_mean == pytest.approx(kl.mean(), rel=1e-3, abs=1e-6) and row.kl_max == pytest.approx(
        kl.max(), rel=1e-3
    )
    assert row.top1_agreement == agree / positions
    assert 0 < row.kl_mean and row.perplexity != report.reference.perplexity  # the 4 bits changed something
    # progress: each model loaded (window 0), each of its windows, then its result line
    n = len(windows)
    expected = [(i, k, k == n + 1) for i in (0, 1) for k in range(n + 2)]
    assert [(p.index, p.window + (p.line is not None), p.line is not None) for p in seen] == expected
    assert {(p.model, p.models, p.windows) for p in seen} == {("llama", 2, n), ("llama-4bit-g64", 2, n)}


def test_a_window_past_the_context_is_refused(checkpoint_dir, tmp_path):
    """Was: measured positions past the model's trained context without a word."""
    from conftest import assert_one_line_error, invoke_cli

    reference = checkpoint_dir("llama")
    context = load(reference)[0].config.max_position_embeddings
    text = tmp_path / "text.txt"
    text.write_text(TEXT)
    args = ["quality", str(reference), str(checkpoint_dir("llama", 4, 64)), "--text", str(text)]
    assert_one_line_error(invoke_cli(*args, "--window", str(context + 1)), f"--window {context + 1:,} is longer")
    assert invoke_cli(*args, "--window", "16", "--max-tokens", "32").returncode == 0


def test_a_broken_candidate_is_found_before_the_reference_runs(checkpoint_dir, tmp_path, monkeypatch):
    """Was: the reference's whole run (52 s on the embedded model) before a candidate's cut weights, corrupt
    header, broken config.json, other tokenizer or other vocabulary was found. Now each is one line before
    the reference runs: a forward pass here fails the test."""
    import shutil

    import checkpoints
    from conftest import assert_one_line_error, invoke_cli

    import mlxinfer_quant.quality

    monkeypatch.setattr(mlxinfer_quant.quality, "_log_probs", lambda *_: pytest.fail("the reference ran"))
    text = tmp_path / "text.txt"
    text.write_text(TEXT)

    def copy(name, edit):
        out = tmp_path / name
        shutil.copytree(checkpoint_dir("llama", 4, 64), out)
        edit(out)
        return out

    def cut(d):
        weights = d / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

    def header(d):
        (d / "model.safetensors").write_bytes((16).to_bytes(8, "little") + b"{not JSON at all" + bytes(64))

    cases = [
        (copy("cut", cut), "a cut download?"),
        (copy("header", header), "not JSON"),
        (copy("config", lambda d: (d / "config.json").write_text("{")), "config.json"),
        (copy("tokenizer", lambda d: checkpoints.write_tokenizer(d, vocab_size=280)), "tokenizes the text differently"),
        (
            checkpoints.write_checkpoint(tmp_path / "wide", "llama", vocab_size=400),
            "scores 400 tokens, the reference 384",
        ),
    ]
    reference = str(checkpoint_dir("llama"))
    for candidate, fragment in cases:
        good = str(checkpoint_dir("llama", 8, 32))  # a good candidate first: every one is opened before the run
        result = invoke_cli("quality", reference, good, str(candidate), "--text", str(text), "--window", "16")
        assert_one_line_error(result, fragment)
        with pytest.raises(MlxinferError, match=fragment.replace("?", r"\?")):
            evaluate(reference, [candidate], window=16, text=text)
