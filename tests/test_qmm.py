"""The batch-invariant quantized matmul (mlxinfer/cpu/qmm.py, native/qmm/) and the quantized compute path.

(a) the kernel against dequantize-then-float64 matmul over odd shapes, every bits x group size,
    1..64 rows, within a float32 rounding bound;
(b) a row alone == the same row inside a batch, bit for bit, whatever the batch size or shape (the
    kernel, and the whole model on the quantized path);
(c) lazy evaluation and mx.compile;
(d) the embedded model on the quantized path against the float32 path: greedy text, and top-1
    agreement and mean KL over quant/data/eval.txt;
(e) a kernel reported unavailable: one warning line and the old path;
(f) on a CPU with AVX-512VL, its build (4 x 4 tiles) gives the avx2 build's bits (3 x 3 tiles);
(g) the portable C++ build (a CPU without AVX2, an arm64 Mac's) agrees with this one.
Skipped only where the kernel genuinely cannot be built here (no cmake, nanobind or compiler).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from conftest import ROOT
from build_cases import FLOAT_LAYOUTS, INT8_CASES, float_weight, kernel_outputs, model_scores

import mlxinfer
from mlxinfer.cpu import qmm
from mlxinfer.model import dtype_rule, params
from mlxinfer.tokenizer import encode_prompt

_CANNOT_BUILD = ("not installed", "cannot run", "no C compiler", "turned off by MLXINFER_QMM")
if not qmm.available() and any(s in qmm.status()["reason"] for s in _CANNOT_BUILD):
    pytest.skip(f"the quantized matmul kernel cannot be built here: {qmm.status()['reason']}", allow_module_level=True)

EPS = float(np.finfo(np.float32).eps)
LAYOUTS = [(bits, gs) for bits in (4, 8) for gs in (32, 64, 128)]


def test_every_source_is_hashed_and_shipped():
    """The build key hashes every file of native/qmm (an edit to an unhashed file would keep a stale
    build), and a wheel (`pip install .`, not -e) carries them all: the first use builds from them."""
    import fnmatch
    import tomllib

    assert set(qmm.SOURCES) == {p.name for p in qmm.SOURCE_DIR.iterdir() if p.is_file()}
    shipped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for name in qmm.SOURCES:
        assert any(fnmatch.fnmatch(f"native/qmm/{name}", pattern) for pattern in shipped["mlxinfer.cpu"]), name


def test_kernel_builds_and_agrees_here():
    st = qmm.status()
    assert st["active"], st["reason"]
    assert "agreed with mx.quantized_matmul" in st["reason"]


def quantized(n: int, k: int, bits: int, group_size: int, seed: int):
    w = mx.array(np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32))
    return mx.quantize(w, group_size=group_size, bits=bits)


def unpack(wq: mx.array, bits: int) -> np.ndarray:
    """(N, K) integer values from MLX's packed words: value k sits at bit (k * bits) % 32 of word k * bits // 32."""
    words = np.array(wq).astype(np.uint64)
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.uint64) * bits)[None, None, :]
    return ((words[:, :, None] >> shifts) & ((1 << bits) - 1)).reshape(words.shape[0], -1).astype(np.float64)


def reference(x: mx.array, wq, scales, biases, bits: int, group_size: int):
    """float64 y and the float32 rounding bound: 2 (K + 16) eps sum_k |x_k| (|s q_k| + |b|) per output."""
    q = unpack(wq, bits)
    s = np.repeat(np.array(scales.astype(mx.float32)).astype(np.float64), group_size, axis=1)
    b = np.repeat(np.array(biases.astype(mx.float32)).astype(np.float64), group_size, axis=1)
    x64 = np.array(x).astype(np.float64).reshape(-1, q.shape[1])
    y = x64 @ (s * q + b).T
    bound = 2 * (q.shape[1] + 16) * EPS * (np.abs(x64) @ (np.abs(s * q) + np.abs(b)).T)
    return y, bound


@pytest.mark.parametrize("bits,group_size", LAYOUTS)
def test_matches_float64_matmul(bits, group_size):
    shapes = [(256, 40), (640, 200), (1536, 1000)] + ([(96, 7)] if group_size == 32 else [(384, 33)])
    for i, (k, n) in enumerate(shapes):  # 96 with 4-bit groups of 32: the portable path (half a block)
        wq, scales, biases = quantized(n, k, bits, group_size, seed=i)
        for rows in (1, 2, 3, 17, 64):
            x = mx.array(np.random.default_rng(100 + rows).standard_normal((rows, k)).astype(np.float32))
            got = np.array(qmm.quantized_matmul(x, wq, scales, biases, group_size, bits)).astype(np.float64)
            want, bound = reference(x, wq, scales, biases, bits, group_size)
            err = np.abs(got - want)
            assert (err <= bound).all(), (k, n, rows, float((err / bound).max()))


@pytest.mark.parametrize("dtype", [mx.float16, mx.bfloat16, mx.float32])
def test_scales_in_any_float_dtype_and_mlx_agrees(dtype):
    wq, scales, biases = quantized(200, 576, 4, 32, seed=7)
    scales, biases = scales.astype(dtype), biases.astype(dtype)
    x = mx.random.normal((5, 576), key=mx.random.key(3))
    got = qmm.quantized_matmul(x, wq, scales, biases, 32, 4)
    with mx.stream(mx.cpu):
        want = mx.quantized_matmul(
            x, wq, scales.astype(mx.float32), biases.astype(mx.float32), transpose=True, group_size=32, bits=4
        )
    assert got.dtype == mx.float32
    assert mx.allclose(got, want, rtol=1e-4, atol=1e-3).item()


@pytest.mark.parametrize("bits,group_size", LAYOUTS)
def test_a_row_alone_equals_the_row_in_a_batch(bits, group_size, tile_width):
    k, n = 768, 1002  # 512-bit tiles take 32 columns at a time: the last 10 of a thread's columns run 256-bit
    wq, scales, biases = quantized(n, k, bits, group_size, seed=11)
    batch = mx.random.normal((64, k), key=mx.random.key(5))
    full = qmm.quantized_matmul(batch, wq, scales, biases, group_size, bits)
    mx.eval(full)
    for r in (0, 1, 17, 62, 63):
        alone = qmm.quantized_matmul(batch[r : r + 1], wq, scales, biases, group_size, bits)
        assert mx.array_equal(alone, full[r : r + 1]).item(), r
    for start, size in ((3, 2), (10, 5), (0, 33)):  # odd batch sizes: other tile shapes and remainders
        part = qmm.quantized_matmul(batch[start : start + size], wq, scales, biases, group_size, bits)
        assert mx.array_equal(part, full[start : start + size]).item(), (start, size)
    batched_3d = qmm.quantized_matmul(batch.reshape(8, 8, k), wq, scales, biases, group_size, bits)
    assert mx.array_equal(batched_3d.reshape(64, n), full).item()


_AVX2_BUILD = """
import sys
import mlx.core as mx
import numpy as np
from mlxinfer.cpu import qmm
from build_cases import kernel_outputs
assert qmm.available() and qmm.kernel().tile() == "3x3", qmm.status()
np.savez(sys.argv[2], **kernel_outputs(mx.array(np.load(sys.argv[1]))))
"""

_PORTABLE_BUILD = """
import sys
import mlx.core as mx
import numpy as np
from mlxinfer.cpu import qmm
from build_cases import FLOAT_LAYOUTS, float_weight, kernel_outputs, model_scores
assert qmm.available() and not qmm.kernel().avx2(), qmm.status()
x = mx.array(np.load(sys.argv[1]))
for bits, gs in FLOAT_LAYOUTS:  # a row alone: the same bits as in the batch
    w = float_weight(bits, gs)
    full = qmm.quantized_matmul(x, *w, gs, bits)
    for r in (0, 7, 60):
        assert mx.array_equal(qmm.quantized_matmul(x[r : r + 1], *w, gs, bits), full[r : r + 1]).item(), (bits, gs, r)
np.savez(sys.argv[2], **kernel_outputs(x), **model_scores())
"""


def other_build(tmp_path, isa: str, script: str) -> tuple[np.ndarray, dict]:
    """x (61, 768: full tiles and every remainder), and what `script` saved from it, run in a
    subprocess on the `isa` build (MLXINFER_QMM_ISA: built there if it is not yet)."""
    x = np.array(mx.random.normal((61, 768), key=mx.random.key(3)))
    np.save(tmp_path / "x.npy", x)
    env = {**os.environ, "MLXINFER_QMM_ISA": isa, "PYTHONPATH": str(ROOT / "tests")}
    path = tmp_path / f"{isa}.py"
    path.write_text(script)
    done = subprocess.run([sys.executable, str(path), str(tmp_path / "x.npy"), str(tmp_path / "y.npz")],
                          capture_output=True, text=True, cwd=ROOT, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return x, dict(np.load(tmp_path / "y.npz"))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.skipif(
    not qmm._isa().startswith("avx512"), reason="this CPU has no AVX-512VL: the avx2 build is the one here"
)
def test_the_avx512_build_gives_the_avx2_builds_bits(tmp_path, tile_width):
    """The avx512 build runs the same AVX2 arithmetic in 4 x 4 tiles (AVX-512VL's 32 registers): every
    output's bits equal the avx2 build's (3 x 3 tiles), built and run here in a subprocess. So do the
    int8 path's, whose integer sums are VNNI instructions in one build and AVX2's maddubs in the other."""
    assert qmm.kernel().tile() == "4x4"
    x, theirs = other_build(tmp_path, "avx2", _AVX2_BUILD)
    ours = kernel_outputs(mx.array(x))
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert same_bits(ours[name], theirs[name]), name


def test_the_portable_build_agrees_with_this_one(tmp_path):
    """The portable C++ build (what a CPU without AVX2+FMA, e.g. an arm64 Mac's, runs), built and run
    here in a subprocess: its rows alone equal its batch bit for bit; its float32 kernel (its own fixed
    order) agrees with this build's within float32 rounding; its int8 path gives this build's bits; and
    the embedded model's fused layers (prefill, and a two-row decode step at two offsets) give this
    build's scores within rounding and the same top token."""
    x, theirs = other_build(tmp_path, "portable", _PORTABLE_BUILD)
    ours = kernel_outputs(mx.array(x))
    for bits, gs in FLOAT_LAYOUTS:
        wq, s, b = float_weight(bits, gs)
        bound = 768 * EPS * np.abs(x) @ np.abs(np.array(mx.dequantize(wq, s, b, group_size=gs, bits=bits))).T
        assert np.all(np.abs(ours[f"{bits}-{gs}"] - theirs[f"{bits}-{gs}"]) <= 2 * bound + 1e-30), (bits, gs)
    for bits, gs, _ in INT8_CASES:
        assert same_bits(ours[f"int8-{bits}-{gs}"], theirs[f"int8-{bits}-{gs}"]), (bits, gs)
    for name, scores in model_scores().items():
        # measured: 6e-5 and 8e-5 of scores up to ~31 (30 layers of float32 sums in another order)
        assert np.abs(scores - theirs[name]).max() <= 2e-5 * np.abs(scores).max(), name
        assert np.array_equal(scores.argmax(-1), theirs[name].argmax(-1)), name


def test_lazy_composes_and_compiles():
    wq, scales, biases = quantized(200, 256, 4, 64, seed=2)
    x = mx.random.normal((3, 256), key=mx.random.key(9))

    def f(x):
        return qmm.quantized_matmul(x * 2.0, wq, scales, biases, 64, 4) + 1.0

    eager = f(x)
    assert mx.array_equal(mx.compile(f)(x), eager).item()
    assert mx.array_equal(mx.compile(f, shapeless=True)(x), eager).item()
    assert mx.array_equal(mx.compile(f, shapeless=True)(x[:1]), eager[:1]).item()


def test_a_strided_input_is_read_by_its_strides():
    wq, scales, biases = quantized(40, 256, 8, 32, seed=4)
    x = mx.random.normal((256, 6), key=mx.random.key(1)).T  # (6, 256), column-major in memory
    want = qmm.quantized_matmul(mx.array(np.ascontiguousarray(np.array(x))), wq, scales, biases, 32, 8)
    assert mx.array_equal(qmm.quantized_matmul(x, wq, scales, biases, 32, 8), want).item()


def test_a_layout_it_does_not_take_is_refused():
    wq, scales, biases = quantized(40, 256, 4, 64, seed=4)
    x = mx.zeros((1, 256))
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        qmm.kernel().quantized_matmul(x, wq, scales, biases, 64, 3)
    with pytest.raises(ValueError, match="does not match"):
        qmm.kernel().quantized_matmul(mx.zeros((1, 128)), wq, scales, biases, 64, 4)
    assert not qmm.supports(64, 3, 256) and not qmm.supports(64, 4, 256, mode="mxfp4")


# ---------------------------------------------------------------- the embedded model


def greedy(model, ids: list[int], n: int) -> list[int]:
    cache, x, out = model.make_cache(), mx.array([ids]), []
    for _ in range(n):
        token = mx.argmax(model(x, cache)[0, -1]).item()
        out.append(token)
        x = mx.array([[token]])
    return out


def test_auto_picks_the_quantized_path_here(embedded_quantized):
    model, _ = embedded_quantized
    assert model.info.compute_dtype == "quantized"
    assert "activations float32" in model.info.weights
    assert dtype_rule.auto_rule(
        device="cpu", fast_blas=False, model_bytes_float32=2**40, ram_bytes=2**30, quantized_weights=True,
        quantized_kernel=True,
    )[0] == "quantized"  # fmt: skip
    assert dtype_rule.choose_compute_dtype("auto", params.float32_nbytes(model), quantized_weights=True) == "quantized"


def test_greedy_text_equals_the_float32_paths(embedded_quantized, embedded_fast):
    (quant, tok), (f32, _) = embedded_quantized, embedded_fast
    ids = encode_prompt(tok, "Name one fruit. Answer with one word.", chat=True)
    assert greedy(quant, ids, 16) == greedy(f32, ids, 16)


def test_quality_against_the_float32_path(embedded_quantized, embedded_fast):
    (quant, tok), (f32, _) = embedded_quantized, embedded_fast
    ids = tok.encode((ROOT / "quant" / "data" / "eval.txt").read_text())[:384]
    x = mx.array([ids])
    ref, got = f32(x)[0].astype(mx.float32), quant(x)[0]
    lp_ref, lp = ref - mx.logsumexp(ref, axis=-1, keepdims=True), got - mx.logsumexp(got, axis=-1, keepdims=True)
    kl = (mx.exp(lp_ref) * (lp_ref - lp)).sum(axis=-1)
    agree = (mx.argmax(lp_ref, axis=-1) == mx.argmax(lp, axis=-1)).astype(mx.float32).mean().item()
    assert kl.mean().item() < 1e-5 and agree >= 0.999, (kl.mean().item(), agree)


def test_unavailable_kernel_falls_back_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(qmm, "_state", {"checked": True, "active": False, "path": None, "reason": "test: not built"})
    monkeypatch.setattr(qmm, "_module", None)
    monkeypatch.setattr(qmm, "_warned", False)
    model, _ = mlxinfer.load(None, compute_dtype="quantized")
    err = capsys.readouterr().err.strip().splitlines()
    assert model.info.compute_dtype in ("float32", "bfloat16")
    assert len(err) == 1 and "test: not built" in err[0], err
    assert dtype_rule.choose_compute_dtype("auto", params.float32_nbytes(model), quantized_weights=True) != "quantized"


def test_eager_build_prints_one_line():
    done = subprocess.run([sys.executable, "-m", "mlxinfer.cpu.qmm"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("built ") and lines[0].endswith("in use"), lines


def test_info_reports_the_kernel():
    info = mlxinfer.system_info()
    assert info["quantized_matmul"]["active"], info["quantized_matmul"]
    assert info["compute_dtype"]["auto_for_quantized_weights"] == "quantized"


def test_the_tile_width_switch_is_read_and_reported():
    """MLXINFER_QMM_WIDE=0/off forces 256-bit tiles, 1/on 512-bit tiles where the build has AVX-512F
    (native/qmm/wide.h); the status line (`mlxinfer info`) says which."""
    script = "from mlxinfer.cpu import qmm; qmm.available(); print(qmm.kernel().wide(), qmm.status()['reason'])"
    seen = {}
    for value in ("0", "off", "1", "on"):
        env = {**os.environ, "MLXINFER_QMM_WIDE": value}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        wide, reason = done.stdout.split(" ", 1)
        seen[value] = wide == "True"
        assert seen[value] == ("512-bit tiles" in reason), reason
    assert not seen["0"] and not seen["off"]
    assert seen["1"] == seen["on"] == qmm._isa().startswith("avx512")


def assert_rows_score_alone_as_in_a_batch(model, rows: list[list[int]], picks) -> None:
    """The prefill's last scores and one greedy decode step's, for rows run together and for each row
    in `picks` alone: equal, bit for bit."""

    def run(batch):
        cache = model.make_cache()
        first = model(mx.array(batch), cache)[:, -1, :]
        step = model(mx.argmax(first, axis=-1)[:, None], cache)[:, -1, :]
        mx.eval(first, step)
        return first, step

    first, step = run(rows)
    for i in picks:
        alone_first, alone_step = run([rows[i]])
        assert mx.array_equal(alone_first[0], first[i]).item() and mx.array_equal(alone_step[0], step[i]).item(), i


def test_the_model_scores_a_row_alone_as_in_a_batch(embedded_quantized):
    """The whole forward pass on the quantized path: prefill and one decode step, 8 rows vs each alone."""
    rows = [list(range(100 + 7 * i, 124 + 7 * i)) for i in range(8)]
    assert_rows_score_alone_as_in_a_batch(embedded_quantized[0], rows, (0, 3, 7))


def test_a_stopped_build_ends_the_tools_it_started(tmp_path):
    """Was: SIGTERM during the kernel's build removed the partial output but left cmake's children (ninja,
    the compilers) running. A stand-in cmake starts a child and waits; the build is stopped while both
    run; afterwards neither does, and no partial is left."""
    cmake = tmp_path / "cmake"
    pids = tmp_path / "pids"
    cmake.write_text(f"#!/bin/sh\nsleep 300 &\necho $$ $! > {pids}.tmp\nmv {pids}.tmp {pids}\nwait\n")
    cmake.chmod(0o755)
    script = (
        "import sys\nfrom pathlib import Path\nfrom mlxinfer.cpu import qmm\n"
        f"qmm._tools = lambda: {str(cmake)!r}\nqmm.build_dir = lambda: Path({str(tmp_path / 'out')!r})\n"
        "qmm.build()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while not pids.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert pids.exists(), proc.stderr.read() if proc.poll() is not None else "the stand-in never ran"
        tool, child = (int(p) for p in pids.read_text().split())
        assert _running(tool) and _running(child)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err
    deadline = time.monotonic() + 10
    while (_running(tool) or _running(child)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(tool) and not _running(child)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cmake", "pids"]


def _running(pid: int) -> bool:
    """Whether pid is a live process (a zombie waiting for its parent counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")
