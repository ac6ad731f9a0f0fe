"""The batched draw (cpu/native/draw_rows.c, keychain.py): every bit against MLX's own ops.

The kernel replaces one mx.random.categorical call per row with one call for the batch. It is
only worth having if it is exact: these tests compare its exp with mx.exp, its key chains with
mx.random.split/uniform, and its tokens with mx.random.categorical's, row by row.
"""

from __future__ import annotations

import os
import platform
import sys
import time

import mlx.core as mx
import numpy as np
import pytest
from conftest import HERB, HERB_SEEDS

import mlxinfer
from mlxinfer import keychain
from mlxinfer.cpu import draw as cpu_draw
from mlxinfer.errors import MlxinferError
from mlxinfer.sampler import draw, draw_rows

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and platform.machine() == "x86_64"),
    reason="the draw kernel copies MLX's Linux x86_64 CPU exp",
)


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """The kernel, built here from the source (not the set-up's copy)."""
    out = tmp_path_factory.mktemp("draw") / cpu_draw.LIB_NAME
    try:
        cpu_draw.build(out=str(out))
    except MlxinferError as e:
        pytest.skip(str(e))
    return cpu_draw._load(str(out))


@pytest.fixture
def native(kernel, monkeypatch):
    """The sampler's batched draw goes through the test's kernel; `calls` counts the rows it drew."""
    calls = []
    real = cpu_draw.draw_rows

    def counted(scaled, uniforms, lib=None):
        calls.append(len(uniforms))
        return real(scaled, uniforms, lib)

    monkeypatch.setattr(cpu_draw, "_lib", kernel)
    monkeypatch.setattr(cpu_draw, "_state", {"checked": True, "active": True, "path": "test", "reason": "test"})
    monkeypatch.setattr(cpu_draw, "draw_rows", counted)
    return calls


@pytest.fixture
def fresh_state(monkeypatch):
    """available() checks again, and whatever it decides is undone after the test."""
    monkeypatch.setattr(cpu_draw, "_state", {"checked": False, "active": False, "path": None, "reason": ""})
    monkeypatch.setattr(cpu_draw, "_lib", None)


def bits_equal(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.view(np.uint32) == b.view(np.uint32)) | (np.isnan(a) & np.isnan(b))


@pytest.mark.slow
def test_exp_is_mlx_exp_bit_for_bit(kernel):
    """Every 211th float32 from -88.5 to 88.5, random values, the edges, and the inputs whose
    x * log2(e) lands next to k + 1/2 (where rounding x + 0.5 in float instead of double differs)."""
    negative = np.arange(0x80000000, 0x80000000 + 0x42B10000, 211, dtype=np.uint64).astype(np.uint32)
    positive = np.arange(0, 0x42B10000, 211, dtype=np.uint64).astype(np.uint32)
    rng = np.random.default_rng(0)
    halves = (np.arange(-127, 127) + 0.5).astype(np.float32) / np.float32(1.442695)
    near = np.concatenate([np.nextafter(halves, np.float32(s * np.inf)) for s in (-1, 1)] + [halves])
    specials = np.array([np.nan, np.inf, -np.inf, 88.0, 88.00001, -88.0, -88.00001, 0.0, -0.0, 1e-45, -1e-45])
    x = np.concatenate(
        [negative.view(np.float32), positive.view(np.float32), rng.uniform(-100, 100, 500_000), near, specials]
    ).astype(np.float32)
    want = np.array(mx.exp(mx.array(x)))
    got = cpu_draw.exp(x, kernel)
    bad = ~bits_equal(got, want)
    assert not bad.any(), (x[bad][:5], got[bad][:5], want[bad][:5])
    assert x.size > 8_000_000


def test_key_chains_and_uniforms_are_mlx_bits():
    seeds = [0, 1, 7, 42, 2**31 - 1, 2**32 + 5, 123456789012, 2**64 - 1]
    chains = np.stack([np.array(mx.random.key(s)) for s in seeds])
    theirs = [mx.random.key(s) for s in seeds]
    for _ in range(6):
        chains, subkeys = keychain.split(chains)
        pairs = [mx.random.split(k) for k in theirs]
        theirs = [p[0] for p in pairs]
        assert np.array_equal(chains, np.stack([np.array(k) for k in theirs]))
        assert np.array_equal(subkeys, np.stack([np.array(p[1]) for p in pairs]))
        want = np.array([mx.random.uniform(shape=(1,), key=p[1]).item() for p in pairs], np.float32)
        assert np.array_equal(keychain.uniform(subkeys), want)


def scores_for(kind: str, rows: int, vocab: int, seed: int) -> mx.array:
    x = mx.random.normal((rows, vocab), key=mx.random.key(seed))
    if kind == "flat":
        return x * 0.5
    if kind == "peaked":
        return x * 6.0
    if kind == "cut":  # -inf but for the few highest: what top-k / top-p / min-p leave
        x = x * 3.0
        return mx.where(x < 4.0, -mx.inf, x)
    if kind == "one left":
        return mx.where(mx.arange(vocab) == 1, 0.0, -mx.inf) + mx.zeros((rows, 1))
    if kind == "ties":
        return mx.zeros((rows, vocab))
    raise ValueError(kind)


@pytest.mark.parametrize("vocab", [2, 13, 4099, 49152])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16], ids=["float32", "bfloat16", "float16"])
def test_rows_draw_what_categorical_draws(kernel, vocab, dtype):
    rows, checked = 9, 0
    chains = np.stack([np.array(mx.random.key(s)) for s in range(rows)])
    for n, kind in enumerate(["flat", "peaked", "cut", "one left", "ties"]):
        for temperature in (0.7, 1.0, 1.5):
            chains, subkeys = keychain.split(chains)
            scaled = scores_for(kind, rows, vocab, 100 * n + vocab).astype(dtype) * (1.0 / temperature)
            want = [mx.random.categorical(scaled[i : i + 1], key=mx.array(subkeys[i])).item() for i in range(rows)]
            got = cpu_draw.draw_rows(np.asarray(scaled.astype(mx.float32)), keychain.uniform(subkeys), kernel)
            assert got.tolist() == want, (kind, temperature)
            checked += rows
    assert checked == 135


def test_a_batch_split_over_two_threads_draws_what_categorical_draws(kernel, monkeypatch):
    """From 2 * SPLIT_ROWS rows on, half the rows are drawn on a helper thread: every row's token is
    still the one mx.random.categorical draws for that row alone, odd row counts included."""
    monkeypatch.setattr(cpu_draw, "_cores", lambda: 2)
    used = []
    real = cpu_draw.concurrent.futures.ThreadPoolExecutor.submit
    monkeypatch.setattr(
        cpu_draw.concurrent.futures.ThreadPoolExecutor, "submit", lambda *a, **k: used.append(1) or real(*a, **k)
    )
    for rows in (2 * cpu_draw.SPLIT_ROWS - 1, 2 * cpu_draw.SPLIT_ROWS, 2 * cpu_draw.SPLIT_ROWS + 9):
        chains = np.stack([np.array(mx.random.key(1000 + s)) for s in range(rows)])
        _, subkeys = keychain.split(chains)
        scaled = scores_for("flat", rows, 4099, rows)
        want = [mx.random.categorical(scaled[i : i + 1], key=mx.array(subkeys[i])).item() for i in range(rows)]
        got = cpu_draw.draw_rows(np.asarray(scaled), keychain.uniform(subkeys), kernel)
        assert got.tolist() == want, rows
    assert len(used) == 2  # the two batches of 2 * SPLIT_ROWS rows or more, not the one below


def test_a_forked_child_draws_a_split_batch(kernel, monkeypatch):
    """The helper thread does not survive fork: a child that draws a split batch makes its own
    (before, its submit would wait forever on the parent's thread)."""
    monkeypatch.setattr(cpu_draw, "_cores", lambda: 2)
    rows = 2 * cpu_draw.SPLIT_ROWS
    x = np.random.default_rng(5).normal(size=(rows, 257)).astype(np.float32)
    u = np.linspace(0.05, 0.95, rows, dtype=np.float32)
    want = cpu_draw.draw_rows(x, u, kernel).tolist()  # the parent's helper now exists
    assert cpu_draw._helper is not None
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if it drew the parent's tokens
        os._exit(0 if cpu_draw.draw_rows(x, u, kernel).tolist() == want else 1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child's draw did not finish in 30 s")


def test_a_tie_at_the_threshold_resolves_as_mlx_does(kernel):
    """Scores [0, b] with u * (1 + e**b) == 1 exactly: MLX counts c_j <= threshold, so token 1.
    Search b near log(1/u - 1) until the float32 arithmetic ties."""
    found = 0
    for seed in range(400):
        _, sub = keychain.split(np.array([np.array(mx.random.key(seed))]))
        u = keychain.uniform(sub)
        if not 0.55 < u[0] < 0.95:
            continue
        b = np.float32(np.log(1 / u[0] - 1)) + np.arange(-300, 300, dtype=np.float32) * np.float32(1.2e-7)
        x = np.stack([np.zeros_like(b), b], 1).astype(np.float32)
        e = np.array(mx.exp(mx.array(x)))  # max is 0: scores are already x - max
        ties = np.nonzero(e[:, 0] == u[0] * (e[:, 0] + e[:, 1]))[0]
        for i in ties[:2]:
            want = mx.random.categorical(mx.array(x[i : i + 1]), key=mx.array(sub[0])).item()
            assert cpu_draw.draw_rows(x[i : i + 1], u, kernel).tolist() == [want]
            found += 1
        if found >= 4:
            break
    assert found >= 4


def test_rows_with_no_finite_maximum_draw_what_mlx_draws(kernel):
    """Never reached through cut_tail (it keeps a finite token), but a model can emit them: rows all
    -inf (MLX draws uniformly), with +inf (the inf tokens share the draw), with NaN (the last token)."""
    inf, nan = np.inf, np.nan
    x = np.array(
        [[-inf] * 5, [0, inf, 1, 2, 3], [inf, inf, 0, 1, -inf], [1, nan, 2, 3, 4], [nan] * 5, [-inf, 0, -inf, -inf, 1]],
        np.float32,
    )
    x = np.repeat(x, 6, axis=0)
    _, subkeys = keychain.split(np.stack([np.array(mx.random.key(s)) for s in range(len(x))]))
    want = [mx.random.categorical(mx.array(x[i : i + 1]), key=mx.array(subkeys[i])).item() for i in range(len(x))]
    assert cpu_draw.draw_rows(x, keychain.uniform(subkeys), kernel).tolist() == want
    assert len(set(want[:6])) > 1  # the all -inf rows really are spread


def test_the_sampler_batches_rows_with_their_own_temperatures(native):
    """sampler.draw_rows through the kernel equals draw() row by row: greedy rows, mixed temperatures,
    bfloat16 scores, a batch broadcast from one row (the first step after the prefill)."""
    vocab, rows = 4099, 12
    temperatures = [0.0, 0.7, 1.0, 1.5] * 3
    for kept in (
        mx.random.normal((rows, vocab), key=mx.random.key(5)) * 3.0,
        (mx.random.normal((rows, vocab), key=mx.random.key(6)) * 3.0).astype(mx.bfloat16),
        mx.broadcast_to(mx.random.normal((1, vocab), key=mx.random.key(7)) * 2.0, (rows, vocab)),
    ):
        chains = np.stack([np.array(mx.random.key(s)) for s in range(rows)])
        for same in (False, True):
            temps = [1.3] * rows if same else temperatures
            chains, subkeys = keychain.split(chains)
            got = draw_rows(kept, temps, list(subkeys))
            want = mx.concatenate([draw(kept[i : i + 1], temps[i], mx.array(subkeys[i])) for i in range(rows)])
            assert got.dtype == want.dtype and got.tolist() == want.tolist()
    assert native == [rows] * 6  # every batch went through the kernel


def test_the_check_at_first_use_accepts_the_kernel(kernel, fresh_state, monkeypatch):
    monkeypatch.setattr(cpu_draw, "library_path", lambda: kernel._name)
    assert cpu_draw.available() is True
    assert cpu_draw.status()["reason"].startswith("agreed with MLX")


def test_a_kernel_that_disagrees_is_not_used(kernel, fresh_state, monkeypatch):
    """The safety net: verify() compares with mx.exp and mx.random.categorical; a wrong answer turns
    the kernel off (one line in status) and the sampler draws row by row, still exactly."""
    monkeypatch.setattr(cpu_draw, "draw_rows", lambda x, u, lib=None: np.zeros(len(u), np.int32))
    assert "differ from mx.random.categorical" in cpu_draw.verify(kernel)
    monkeypatch.setattr(cpu_draw, "library_path", lambda: kernel._name)
    assert cpu_draw.available() is False
    assert "differ" in cpu_draw.status()["reason"]
    kept = mx.random.normal((8, 100), key=mx.random.key(1))
    _, subkeys = keychain.split(np.stack([np.array(mx.random.key(s)) for s in range(8)]))
    want = [mx.random.categorical(kept[i : i + 1], key=mx.array(subkeys[i])).item() for i in range(8)]
    assert draw_rows(kept, [1.0] * 8, list(subkeys)).tolist() == want


def test_an_exp_one_bit_off_is_caught(kernel, monkeypatch):
    real = cpu_draw.exp

    def off(x, lib=None):
        out = real(x, lib)
        out[123] = np.nextafter(out[123], np.float32(np.inf))
        return out

    monkeypatch.setattr(cpu_draw, "exp", off)
    assert "its exp differs from mx.exp" in cpu_draw.verify(kernel)


@pytest.mark.parametrize(
    "patch, reason",
    [
        ({"ABI": 99}, "from another version of mlxinfer; rebuild it"),
        ({"_cpu_flags": lambda: set()}, "built for a CPU with AVX2 and FMA; rebuild it here"),
    ],
    ids=["old library", "other cpu"],
)
def test_a_library_it_must_not_call_is_refused_before_any_call(kernel, fresh_state, monkeypatch, patch, reason):
    if "_cpu_flags" in patch and not kernel.mlxinfer_draw_needs_avx2():
        pytest.skip("the kernel was built without AVX2 here")
    for name, value in patch.items():
        monkeypatch.setattr(cpu_draw, name, value)
    monkeypatch.setattr(cpu_draw, "library_path", lambda: kernel._name)
    assert cpu_draw.available() is False
    assert reason in cpu_draw.status()["reason"]


def test_a_compiler_that_is_not_there_is_one_line(tmp_path):
    with pytest.raises(MlxinferError, match=r"cannot run /nonexistent/cc to build the draw kernel"):
        cpu_draw.build(out=str(tmp_path / "lib.so"), compiler="/nonexistent/cc")
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.slow
def test_an_experiment_draws_the_same_with_and_without_the_kernel(native, embedded, herb_seeds_without_the_kernel):
    """16 seeds on the 4-bit embedded model (where test_experiments finds every seed equal to mlx-lm's):
    the kernel changes the speed, not one token. Without it: the shared run, drawn by MLX's own ops."""
    model, tokenizer = embedded
    without, kernel_rows = herb_seeds_without_the_kernel
    assert kernel_rows == 0  # those draws did not go through the kernel
    with_kernel = mlxinfer.sample(model, tokenizer, HERB, **HERB_SEEDS)
    assert native and native[0] == 16  # the batch's draws went through the kernel
    assert [c.tokens for c in with_kernel.completions] == [c.tokens for c in without.completions]
    assert len({c.text for c in with_kernel.completions}) > 4
