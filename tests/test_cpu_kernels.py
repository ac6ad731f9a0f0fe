"""cpu_kernels.py: the float32 CPU path's own exp/SwiGLU and RoPE, against float64 math and MLX's own ops."""

from __future__ import annotations

import math
import os
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

import mlxinfer
from mlxinfer.cpu import kernels as cpu_kernels
from mlxinfer.formats.config import ModelConfig
from mlxinfer.model.model import RoPE


def test_exp_within_a_few_float32_roundings_of_float64():
    x = mx.linspace(-87.0, 88.0, 400_001)  # the whole float32 range of e**x, normal results only
    want = np.exp(np.array(x, np.float64))
    got = np.array(cpu_kernels.exp(x), np.float64)
    rel = np.abs(got - want) / want
    assert rel.max() < 3e-7, rel.max()  # 2.5 units of float32 rounding (6e-8)
    assert float(cpu_kernels.exp(mx.array([0.0])).item()) == 1.0
    assert float(cpu_kernels.exp(mx.array([1.0])).item()) == pytest.approx(math.e, rel=1e-7)


def test_swiglu_equals_silu_times_up_including_extremes():
    rng = np.random.default_rng(0)
    gate = np.concatenate([rng.standard_normal(4096) * 6, [-1e4, -100.0, -88.5, 0.0, 88.5, 100.0, 1e4]])
    up = rng.standard_normal(gate.size)
    gate32, up32 = mx.array(gate.astype(np.float32)), mx.array(up.astype(np.float32))
    got = np.array(cpu_kernels.swiglu(gate32, up32), np.float64)
    g = np.array(gate32, np.float64)
    with np.errstate(over="ignore"):  # e**1e4 is inf in float64 too; g / inf is the right 0
        want = g / (1 + np.exp(-g)) * np.array(up32, np.float64)
    assert np.all(np.isfinite(got))
    assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-3)) < 1e-6
    # and the same function MLX's nn.silu computes, to its own accuracy
    mlx_own = np.array(nn.silu(gate32) * up32, np.float64)
    assert np.max(np.abs(got - mlx_own) / np.maximum(np.abs(want), 1e-3)) < 1e-5


def _config(**overrides) -> ModelConfig:
    fields = dict(
        model_type="llama",
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=64,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=8192,
    )
    fields.update(overrides)
    return ModelConfig.from_dict(fields)


@pytest.mark.parametrize(
    "scaling",
    [
        None,
        {"rope_type": "linear", "factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
    ids=["default", "linear", "llama3"],
)
def test_rope_table_equals_mx_fast_rope(scaling):
    rope = RoPE(_config(rope_scaling=scaling))
    x = mx.random.normal((1, 4, 7, 64), key=mx.random.key(3))
    step = x[:, :, :1]
    want = [rope(x, offset=0), rope(step, offset=300), rope(step, offset=5000)]
    rope.kernels.rope_table = rope.make_table()
    got = [rope(x, offset=0), rope(step, offset=300), rope(step, offset=5000)]  # 300, 5000: the table grows
    for g, w, offset in zip(got, want, (7, 301, 5001)):
        # mx.fast.rope forms its angles in float32 (error ~ angle * 6e-8); the table's are float64
        assert float(mx.abs(g - w).max()) < 5e-7 * offset + 1e-5


def test_model_with_cpu_kernels_matches_mlx_ops_through_the_cache(checkpoint_dir):
    model, _ = mlxinfer.load(str(checkpoint_dir("llama")), compute_dtype="float32")
    assert model.info.cpu_kernels  # to_float32 on the CPU turns them on
    assert model.kernels.kind == "cpu" and model.kernels.rope_table is not None
    assert all(layer.self_attn.rope.kernels is model.kernels for layer in model.layers)  # one, shared
    reference, _ = mlxinfer.load(str(checkpoint_dir("llama")), compute_dtype="float32")
    reference.kernels.choose("mlx", reference)  # back to MLX's own ops
    ids = mx.array([[5, 17, 42, 99, 3, 250, 7, 8]])
    caches = model.make_cache(), reference.make_cache()
    outs = [m(ids[:, :6], c) for m, c in zip((model, reference), caches)]
    for t in range(6, 8):  # two decode steps through the KV cache
        outs = [
            mx.concatenate([o, m(ids[:, t : t + 1], c)], axis=1) for o, m, c in zip(outs, (model, reference), caches)
        ]
    assert float(mx.abs(outs[0] - outs[1]).max()) < 1e-4


@pytest.mark.parametrize(
    "settings",
    [
        {"temperature": 0.7},
        {"temperature": 1.5, "top_k": 20},
        {"temperature": 1.0, "top_p": 0.9},
        {"temperature": 1.0, "min_p": 0.05},
        {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.02},
        {"temperature": 1.0, "top_p": 0.9, "top_k": 50, "order": "mlx-lm"},
    ],
)
def test_the_fast_cut_keeps_what_mlx_exp_keeps(settings):
    """sampler.stages with fast=True (the CPU paths: the native log-softmax and the polynomial exp instead of
    MLX's CPU exp), on the embedded model's real scores after several prompts: the same tokens kept as with
    MLX's exp, and each token's probability at T and as drawn within 5e-5 of a float64 softmax and no further
    from it than MLX's own but for 2e-6 (MLX's float32 logsumexp is off by up to ~7e-5 in the log, the native one
    by ~2e-6, so the fast path is often closer); what is drawn sums to 1 within 1e-6 in float64."""
    from mlxinfer.sampler import cut_tail, kept_probabilities, log_softmax

    rows = _last_scores(
        ["Name one herb to add to tomato soup.", "Name one fruit.", "The capital of France is", "1, 2, 3,"]
    )
    s = mlxinfer.SamplerSettings(**settings)
    lp = log_softmax(rows)  # (4, V)
    assert mx.array_equal(cut_tail(lp, s, fast=True) > -math.inf, cut_tail(lp, s) > -math.inf).item()
    for row in rows:  # (V,) each
        ref, got = kept_probabilities(row, s), kept_probabilities(row, s, fast=True)
        assert mx.array_equal(ref[2], got[2]).item()  # kept
        x = np.array(row, np.float64) / s.temperature
        p64 = np.exp(x - x.max())
        p64 /= p64.sum()
        kept = np.array(got[2])
        final64 = np.where(kept, p64, 0.0) / p64[kept].sum()
        for mine, theirs, truth in ((got[1], ref[1], p64), (got[3], ref[3], final64)):
            error = np.abs(np.array(mine, np.float64) - truth).max()
            assert error <= min(5e-5, np.abs(np.array(theirs, np.float64) - truth).max() + 2e-6), error
        assert abs(np.array(got[3], np.float64).sum() - 1.0) < 1e-6  # MLX's float32 sum of it is ~5e-5 short


def test_exp_kept_is_zero_exactly_where_a_cut_left_minus_inf():
    x = mx.array([[-math.inf, 0.0, -1.0, -100.0, -math.inf]])
    e = cpu_kernels.exp_kept(x)
    assert e[0, 0].item() == 0.0 and e[0, 4].item() == 0.0 and e[0, 1].item() == 1.0
    p = cpu_kernels.softmax(x)
    assert p[0, 0].item() == 0.0 and abs(mx.sum(p).item() - 1.0) < 1e-6
    assert abs(p[0, 1].item() - 1 / (1 + math.exp(-1) + math.exp(-100))) < 1e-6


def _nucleus64(lp: np.ndarray, p: float, keep: int) -> np.ndarray:
    """apply_top_p's rule in float64 with a full sort, one row: keep each token (in descending order) while the
    mass above it is below p * total, at least `keep` of them, and every token tied with the last kept."""
    e = np.exp(lp.astype(np.float64))
    order = np.sort(lp)[::-1]
    above = np.concatenate([[0.0], np.cumsum(np.exp(order.astype(np.float64)))[:-1]])
    kept = max(int(np.sum(above < p * e.sum())), min(max(keep, 1), len(lp)))
    return lp >= order[kept - 1]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.5])
def test_native_top_p_keeps_the_float64_nucleus(temperature):
    """The extension's top-p (a partial sort of the top tokens, widened until they hold the mass; sums in
    float64) keeps exactly the tokens a float64 full sort keeps, on the embedded model's real rows, at p from
    0.5 to 0.99 and with min_tokens_to_keep. (MLX's float32 cumsum drifts: at p = 0.99 its cut moves by tens of
    tail tokens worth ~1e-5 of mass, so the oracle is float64, not MLX's own apply_top_p.)"""
    from mlxinfer.sampler import apply_top_p

    _assert_native_cut_keeps(apply_top_p, _nucleus64, temperature, (0.5, 0.9, 0.95, 0.99))


def test_native_top_p_ties_floors_and_empty_rows():
    from mlxinfer.sampler import apply_top_p

    tied = mx.log(mx.array([[0.3, 0.2, 0.2, 0.2, 0.1]]))  # the cut lands among three tied tokens: all three stay
    assert np.array(apply_top_p(tied, 0.4, fast=True) > -math.inf).tolist() == [[True, True, True, True, False]]
    lp = mx.log(mx.array([[0.7, 0.2, 0.06, 0.04]]))
    assert np.array(apply_top_p(lp, 0.5, fast=True) > -math.inf).sum() == 1
    assert np.array(apply_top_p(lp, 0.5, 3, fast=True) > -math.inf).sum() == 3  # min_tokens_to_keep
    cut = mx.array([[-math.inf, math.log(0.6), -math.inf, math.log(0.4)]])  # an earlier cut's -inf stay out
    assert np.array(apply_top_p(cut, 0.9, fast=True)).tolist() == np.array(cut).tolist()
    empty = mx.full((1, 5), -math.inf)
    assert np.isneginf(np.array(apply_top_p(empty, 0.9, fast=True))).all()
    # NaN scores (a model that blew up; the engine reports them after the draw): the cut neither crashes in its
    # sort nor hides them, for either native cut
    from mlxinfer.sampler import apply_typical_p

    nan = mx.where(mx.arange(4099) % 7 == 0, mx.nan, mx.random.normal((2, 4099), key=mx.random.key(3)))
    for cut in (apply_top_p, apply_typical_p):
        assert np.isnan(np.array(cut(nan, 0.9, fast=True))[:, ::7]).all()


def _top_k64(x: np.ndarray, k: int, keep: int) -> np.ndarray:
    """apply_top_k's rule with a full sort, one row: every token at least as high as the k-th highest."""
    return x >= np.sort(x)[::-1][min(max(k, keep), len(x)) - 1]


def test_native_top_k_keeps_the_k_highest_and_every_tie_of_the_kth():
    """The extension's top-k (one pass with a heap of the k highest) keeps what a full sort keeps on the
    embedded model's real rows, at k from 1 to 1,000 and with min_tokens_to_keep; where the k-th has no tie
    that is exactly MLX's argpartition set; ties, -inf, NaN and k >= V by hand."""
    from mlxinfer.sampler import apply_top_k

    _assert_native_cut_keeps(apply_top_k, _top_k64, 1.0, (1, 10, 40, 1000))
    lp = mlxinfer.sampler.log_softmax(_last_scores(["Name one fruit.", "1, 2, 3,"]))
    for k in (1, 20, 500):
        assert mx.array_equal(apply_top_k(lp, k, fast=True) > -math.inf, apply_top_k(lp, k) > -math.inf).item()
    tied = mx.log(mx.array([[0.3, 0.2, 0.2, 0.2, 0.1]]))  # the k-th is one of three tied tokens: all three stay
    assert np.array(apply_top_k(tied, 2, fast=True) > -math.inf).tolist() == [[True, True, True, True, False]]
    cut = mx.array([[-math.inf, 1.0, -math.inf, 0.5]])  # fewer finite tokens than k: the -inf stay -inf
    assert np.array(apply_top_k(cut, 3, fast=True)).tolist() == np.array(cut).tolist()
    nan = mx.array([[0.1, math.nan, 0.3, 0.2]])  # a NaN score stays for the engine to report
    got = np.array(apply_top_k(nan, 1, fast=True))[0]
    assert np.isnan(got[1]) and got[2] == np.float32(0.3) and np.isneginf(got[[0, 3]]).all()
    assert apply_top_k(tied, 5, fast=True) is tied  # k >= V: nothing to cut


def test_native_softmax_is_the_bits_of_exp_kept_of_log_softmax():
    """The extension's softmax node is the same arithmetic as the two ops it replaces (the native
    log-softmax, then the polynomial exp with -inf to exactly 0), bit for bit, on real rows and cut rows."""
    from mlxinfer.sampler import apply_top_k, log_softmax

    lp = log_softmax(_last_scores(["Name one herb to add to tomato soup.", "The capital of France is"]) * 1.3)
    for x in (lp, apply_top_k(lp, 50, fast=True), mx.full((1, 7), -math.inf)):
        assert mx.array_equal(cpu_kernels.softmax(x), cpu_kernels.exp_kept(cpu_kernels.log_softmax(x))).item()


def _typical64(x: np.ndarray, p: float, keep: int) -> np.ndarray:
    """apply_typical_p's rule in float64 with a full sort, one row of log-probabilities."""
    x = x.astype(np.float64)
    lp = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
    probs = np.exp(lp)
    entropy = -np.sum(np.where(probs > 0, probs * lp, 0.0))
    distance = np.where(np.isneginf(x), np.inf, np.abs(-lp - entropy))
    order = np.argsort(distance, kind="stable")
    mass = np.cumsum(probs[order])
    n_keep = min(max(int(np.sum(mass < p)) + 1, keep), len(x))
    return distance <= distance[order[n_keep - 1]]


@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.5])
def test_native_typical_p_keeps_the_float64_set(temperature):
    """The extension's typical-p (a partial sort by distance from the entropy, widened until it holds p, in
    float64) keeps exactly what a float64 full sort keeps, on the embedded model's real rows. (MLX's own
    float32 stages differ by 1-4 tokens of hundreds or thousands at T >= 1: many tokens lie at nearly the
    same distance from the entropy, and float32 orders them and sums them otherwise.)"""
    from mlxinfer.sampler import apply_typical_p

    _assert_native_cut_keeps(apply_typical_p, _typical64, temperature, (0.2, 0.5, 0.9, 0.95))
    cut = mx.array([[-math.inf, math.log(0.6), -math.inf, math.log(0.4)]])  # an earlier cut's -inf stay out
    assert np.isneginf(np.array(apply_typical_p(cut, 0.99, fast=True))[0, [0, 2]]).all()


def _last_scores(prompts: list[str]) -> mx.array:
    """The embedded model's scores after each prompt's last token: (len(prompts), V)."""
    model, tok = mlxinfer.load(None)
    return mx.stack([model(mx.array([tok.encode(p)]))[0, -1] for p in prompts])


def _assert_native_cut_keeps(cut, rule, temperature: float, ps) -> None:
    """cut(lp, p, keep, fast=True) keeps what rule(row, p, keep) (float64, a full sort) keeps, on real rows
    tempered by `temperature`, at each p (or k) and at floors of 1, 5 and 300 tokens."""
    from mlxinfer.sampler import log_softmax

    prompts = ["Name one herb to add to tomato soup.", "Name one fruit.", "The capital of France is", "Once upon a"]
    lp = log_softmax(_last_scores(prompts) * (1 / temperature))
    for p in ps:
        for keep in (1, 5, 300):
            got = np.array(cut(lp, p, keep, fast=True) > -math.inf)
            for r, row in enumerate(np.array(lp)):
                assert (got[r] == rule(row, p, keep)).all(), (p, keep, r, got[r].sum())


_FAULTS = """
import json, os, resource, sys
import mlxinfer, mlx.core as mx
from mlxinfer.cpu import heap
from mlxinfer.sampler.stages import kept_probabilities
from mlxinfer.settings import SamplerSettings
state = heap.keep_large_buffers()
x = mx.random.normal((32, 49152)) * 3
settings = SamplerSettings(temperature=0.7, top_k=10)  # T != 1: the scores are multiplied (a new array)
for _ in range(3):
    mx.eval(kept_probabilities(x, settings, fast=True))  # all four, as the table reads them
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    mx.eval(kept_probabilities(x, settings, fast=True))
print(json.dumps({"state": state, "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc's thresholds: Linux only")
def test_large_row_blocks_reuse_freed_memory_instead_of_faulting_in_fresh_pages():
    """A 32-row cut over the vocabulary makes ~6 MiB arrays; with glibc's defaults each came from a fresh
    mmap (thousands of page faults a call, 2x the time); with cpu/heap.py's thresholds, from freed blocks."""
    import json
    import subprocess

    def faults(**env):
        out = subprocess.run(
            [sys.executable, "-c", _FAULTS], env={**os.environ, **env}, capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    kept, default = faults(), faults(MLXINFER_HEAP="off")
    assert kept["state"]["applied"] and not default["state"]["applied"], (kept, default)
    assert kept["faults"] < 100, kept  # a (32, 49152) float32 block is 1,536 pages
    assert default["faults"] > 10 * max(kept["faults"], 100), default  # what the thresholds are for


_HUGE = """
import json, sys
import mlxinfer
from mlx.utils import tree_flatten
from mlxinfer.cpu import heap
model, _ = mlxinfer.load(None, compute_dtype=sys.argv[1])
weights = sum(a.nbytes for _, a in tree_flatten(model.parameters()))
rollup = open("/proc/self/smaps_rollup").read()
huge = int(rollup.split("AnonHugePages:")[1].split()[0]) * 1024
print(json.dumps({"state": heap.state()["huge_pages"], "weights": weights, "huge": huge}))
"""


def _thp_mode() -> str:
    try:
        return open("/sys/kernel/mm/transparent_hugepage/enabled").read().split("[")[1].split("]")[0]
    except (OSError, IndexError):
        return "none"


@pytest.mark.skipif(_thp_mode() not in ("madvise", "always"), reason="transparent huge pages are off here")
@pytest.mark.parametrize("compute_dtype", ["quantized", "bfloat16"])
def test_a_loaded_models_weights_sit_on_2_mib_pages(compute_dtype):
    """The kernel's own accounting (AnonHugePages in /proc/self/smaps_rollup) holds the weights on huge pages
    after load; MLXINFER_HEAP=off leaves the pages as allocated."""
    import json
    import subprocess

    def run(**env):
        out = subprocess.run(
            [sys.executable, "-c", _HUGE, compute_dtype], env={**os.environ, **env}, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.strip().splitlines()[-1])

    on, off = run(), run(MLXINFER_HEAP="off")
    # a span the kernel cannot collapse at once (no free 2 MiB block) is left to khugepaged: most are done here
    assert on["state"]["applied"] and on["state"]["collapsed"] >= 0.8 * on["state"]["spans"], on
    assert on["huge"] >= 0.75 * on["weights"], on
    assert not off["state"]["applied"] and off["state"]["reason"] == "disabled by MLXINFER_HEAP", off
    if _thp_mode() == "madvise":  # "always" may give huge pages without asking
        assert off["huge"] < 0.1 * off["weights"], off
