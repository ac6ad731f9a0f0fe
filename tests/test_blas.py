"""The fast-BLAS preload (mlxinfer/cpu/blas.py) and the float32 compute path (mlxinfer/model/convert.py).

(a) the embedded model greedy-decodes the same tokens on its 4-bit weights and on float32 copies;
(b) a bad MLXINFER_BLAS gives one warning line and MLX's own BLAS, never a crash;
(c) with the mkl package (or the OpenBLAS shim) installed, it is active and float32 matmuls agree with numpy;
(d) the `auto` compute-dtype rule, as a pure function of the facts it reads.
No timing is asserted anywhere (bench/blas_matmul.py measures speed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import ROOT, run_cli

import mlxinfer
from mlxinfer.cpu import blas
from mlxinfer.errors import MlxinferError
from mlxinfer.model.dtype_rule import auto_rule, choose_compute_dtype
from mlxinfer.model.params import float32_nbytes, weights_kind
from mlxinfer.tokenizer import encode_prompt

N_TOKENS = 32
PROMPTS = {
    "fruit": ("Name one fruit. Answer with one word.", True),
    "herb": ("Name one herb to add to tomato soup. Answer with one word.", True),
    "cat": ("The cat sat on the", False),
}
# The 4-bit path as stored runs its activations in float16 (the GGUF scales are float16), so its
# last-position logits differ from the float32 path's by up to ~0.11 (measured: fruit 0.063,
# herb 0.061, cat 0.109, on logits of magnitude ~30): that is float16 rounding, not the weights.
# With the same 4-bit weights and float32 activations the two agree within 1e-3 (last test here).
LOGIT_ATOL = 0.25
LOGIT_ATOL_FLOAT32_ACTIVATIONS = 1e-3
LOGIT_RTOL_OF_MAX = 1e-2  # max |difference| / max |logit|


# ---------------------------------------------------------------- (a) 4-bit vs float32


def greedy(model, ids: list[int], n: int = N_TOKENS) -> tuple[list[int], np.ndarray]:
    """n greedy tokens through the KV cache, and the logits at the prompt's last position."""
    cache = model.make_cache()
    x, out, first = mx.array([ids]), [], None
    for _ in range(n):
        scores = model(x, cache)[0, -1]
        if first is None:
            first = np.array(scores.astype(mx.float32))
        token = int(mx.argmax(scores).item())
        out.append(token)
        x = mx.array([[token]])
    return out, first


@pytest.fixture(scope="module")
def float32_model(embedded_fast):
    return embedded_fast[0]  # mlxinfer.load(None, compute_dtype="float32"): to_float32 on load


@pytest.fixture(scope="module")
def runs(embedded, float32_model):
    """{prompt name: ((4-bit tokens, logits), (float32 tokens, logits))}, decoded once per module."""
    quantized, tok = embedded
    out = {}
    for name, (text, chat) in PROMPTS.items():
        ids = encode_prompt(tok, text) if chat else tok.encode(text)
        out[name] = (greedy(quantized, ids), greedy(float32_model, ids))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PROMPTS))
def test_greedy_tokens_identical(runs, name, embedded):
    (q_tokens, _), (f_tokens, _) = runs[name]
    tok = embedded[1]
    assert f_tokens == q_tokens, (tok.decode(q_tokens), tok.decode(f_tokens))


# llama.cpp, greedy, the same GGUF and the same chat-templated prompt, gives exactly this answer
LLAMA_CPP_FRUIT = "The fruit I'm referring to is the fruit of the blackcurrant, which is a type of citrus fruit."


@pytest.mark.slow
def test_greedy_fruit_answer_is_llama_cpps(runs, embedded):
    """The 4-bit path as stored, greedy through the KV cache, says llama.cpp's answer token for token and
    then ends its turn; the float32 path says the same (test_greedy_tokens_identical)."""
    tok = embedded[1]
    (q_tokens, _), _ = runs["fruit"]
    end = next(i for i, t in enumerate(q_tokens) if t in tok.eos_token_ids)
    assert tok.decode(q_tokens[:end]) == LLAMA_CPP_FRUIT
    assert q_tokens[:end] == tok.encode(LLAMA_CPP_FRUIT) and end == 23


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PROMPTS))
def test_last_position_logits_close(runs, name):
    (_, q_logits), (_, f_logits) = runs[name]
    diff = float(np.max(np.abs(q_logits - f_logits)))
    assert diff < LOGIT_ATOL, diff
    assert diff / float(np.max(np.abs(f_logits))) < LOGIT_RTOL_OF_MAX
    assert int(np.argmax(q_logits)) == int(np.argmax(f_logits))


@pytest.fixture(scope="module")
def quantized_float32_activations():
    """The embedded model with its 4-bit weights kept packed and everything else (scales, biases,
    norms) in float32, so that MLX's quantized matmul runs with float32 activations."""
    from mlx.utils import tree_map

    model, _ = mlxinfer.load(None, compute_dtype="bfloat16")
    model.update(
        tree_map(lambda p: p.astype(mx.float32) if p.dtype in (mx.float16, mx.bfloat16) else p, model.parameters())
    )
    assert weights_kind(model).startswith("4/8-bit quantized (activations float32")  # the Q8_0 table: 8-bit
    return model


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PROMPTS))
def test_4bit_weights_with_float32_activations_match_float32_path_within_1e_3(
    name, quantized_float32_activations, float32_model, embedded
):
    text, chat = PROMPTS[name]
    tok = embedded[1]
    ids = mx.array([encode_prompt(tok, text) if chat else tok.encode(text)])
    got = np.array(quantized_float32_activations(ids)[0, -1])
    want = np.array(float32_model(ids)[0, -1])
    assert got.dtype == want.dtype == np.float32
    assert float(np.max(np.abs(got - want))) < LOGIT_ATOL_FLOAT32_ACTIVATIONS


def test_float32_model_has_no_quantized_or_half_weights(float32_model):
    from mlx.utils import tree_flatten

    kinds = {type(m) for _, m in float32_model.named_modules()}
    assert not kinds & {nn.QuantizedLinear, nn.QuantizedEmbedding}
    assert {str(p.dtype) for _, p in tree_flatten(float32_model.parameters())} == {"mlx.core.float32"}
    assert weights_kind(float32_model) == "float32"
    assert isinstance(float32_model.model.embed_tokens, nn.Embedding)  # tied output table: as_linear is a matmul


def test_to_float32_is_the_exact_dequantization(embedded, float32_model):
    """Converted weights equal the 4-bit tensors dequantized in float32 (s * q + b), bit for bit."""
    quantized = embedded[0]
    pairs = [(quantized.model.embed_tokens, float32_model.model.embed_tokens)]
    for i in (0, len(quantized.layers) - 1):
        q_mods, f_mods = dict(quantized.layers[i].named_modules()), dict(float32_model.layers[i].named_modules())
        pairs += [(m, f_mods[path]) for path, m in q_mods.items() if isinstance(m, nn.QuantizedLinear)]
    assert len(pairs) == 15
    for q, f in pairs:
        s, b = q.scales.astype(mx.float32), q.biases.astype(mx.float32)
        want = mx.dequantize(q.weight, s, b, group_size=q.group_size, bits=q.bits)
        assert f.weight.dtype == mx.float32 and f.weight.shape == want.shape
        assert mx.array_equal(f.weight, want).item()


def test_float32_nbytes_counts_unpacked_weights(embedded):
    # SmolLM2-135M: 134,515,008 parameters, 4 bytes each once dequantized
    assert float32_nbytes(embedded[0]) == 134_515_008 * 4


# ---------------------------------------------------------------- (b) bad MLXINFER_BLAS


def _loaded_library_path(stem: str) -> str:
    """The real path of a shared library this process has loaded (e.g. libm), from /proc/self/maps."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if os.path.basename(path).startswith(stem + ".so"):
                return path
    pytest.skip(f"{stem} not found in /proc/self/maps")


def _info_json(env: dict) -> tuple[subprocess.CompletedProcess, dict]:
    result = run_cli("info", "--json", env=env)
    assert result.returncode == 0, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    return result, json.loads(result.stdout)


def _assert_one_warning(result: subprocess.CompletedProcess, *fragments: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("warning: "), lines[0]
    for fragment in fragments:
        assert fragment.lower() in lines[0].lower(), (fragment, lines[0])


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the preload is Linux-only")
@pytest.mark.parametrize("kind", ["not-a-library", "no-cblas_sgemm", "missing"])
def test_bad_blas_path_warns_once_and_falls_back(kind, tmp_path):
    if kind == "not-a-library":
        path = tmp_path / "libfake_blas.so"
        path.write_text("this is not an ELF file\n")
        path, problem = str(path), "could not be loaded"
    elif kind == "no-cblas_sgemm":
        path, problem = _loaded_library_path("libm"), "does not export cblas_sgemm"
    else:
        path, problem = str(tmp_path / "nowhere" / "libmkl_rt.so.3"), "no such file"
    result, info = _info_json({"MLXINFER_BLAS": path})
    _assert_one_warning(result, path, problem)
    assert info["blas"]["active"] is False
    assert info["blas"]["library"] == "MLX's bundled BLAS"
    assert problem in info["blas"]["reason"]
    assert info["blas"]["float32_matmul_check"]["ok"] is True  # the fallback still computes right
    assert info["compute_dtype"]["fast_blas"] is False
    assert info["compute_dtype"]["auto_for_1gib_float32"] == "bfloat16"


@pytest.mark.skipif(sys.platform != "linux", reason="the preload is Linux-only")
def test_this_test_process_runs_on_the_fast_blas():
    """conftest imports mlxinfer before anything imports mlx; a sorter that moved it after would
    quietly send every float32 matmul of the suite to the reference BLAS (5-10x slower)."""
    installed = blas.find_mkl() or blas.find_openblas_shim()
    if os.environ.get(blas.ENV, "").lower() in ("none", "off", "0") or not installed:
        pytest.skip("no fast BLAS installed here")
    assert blas.status()["active"], blas.status()


@pytest.mark.slow
def test_blas_none_disables_quietly():
    result, info = _info_json({"MLXINFER_BLAS": "none"})
    assert result.stderr.strip() == ""
    assert info["blas"]["active"] is False
    assert "disabled" in info["blas"]["reason"]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the preload is Linux-only")
def test_mlx_imported_first_is_recorded_not_fatal():
    code = "import mlx.core, json, mlxinfer; print(json.dumps(mlxinfer.cpu.blas.status()))"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "MLXINFER_BLAS": "auto"},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["active"] is False and "mlx imported first" in status["reason"]
    assert result.stderr.strip() == ""  # nothing was asked for explicitly, so no warning


# ---------------------------------------------------------------- (c) MKL / OpenBLAS active

LIBRARIES = {  # MLXINFER_BLAS value -> (status library name, file name prefix, installed here?)
    "mkl": ("MKL", "libmkl_rt.so", sys.platform == "linux" and blas.find_mkl() is not None),
    "openblas": ("OpenBLAS", blas.SHIM_NAME, sys.platform == "linux" and blas.find_openblas_shim() is not None),
}
fast_blas = pytest.mark.parametrize(
    "library",
    [
        pytest.param(name, marks=pytest.mark.skipif(not here, reason=f"{name} is not installed/built (see blas.py)"))
        for name, (_, _, here) in LIBRARIES.items()
    ],
)


@pytest.mark.slow
@fast_blas
def test_fast_blas_reported_active(library):
    result, info = _info_json({"MLXINFER_BLAS": library})
    assert result.stderr.strip() == ""
    b = info["blas"]
    name, filename, _ = LIBRARIES[library]
    assert b["active"] is True and b["library"] == name, b
    assert os.path.basename(b["path"]).startswith(filename)
    if library == "mkl":
        assert b["threading_layer"] == (os.environ.get("MKL_THREADING_LAYER") or blas.DEFAULT_MKL_THREADING_LAYER)
    else:
        timeout = os.environ.get("OPENBLAS_THREAD_TIMEOUT") or blas.DEFAULT_OPENBLAS_THREAD_TIMEOUT
        assert b["threading_layer"].endswith(f"thread timeout 2^{timeout} cycles"), b["threading_layer"]
    assert b["float32_matmul_check"]["ok"] is True
    assert info["compute_dtype"]["fast_blas"] is True


# Shapes MLX hands to cblas_sgemm: both operand orders, a batch, and single-row products in
# every transpose combination (decode's shape; the OpenBLAS shim sends these to sgemv) with
# alpha/beta through addmm.
_MATMUL = """
import json, mlxinfer, mlx.core as mx, numpy as np
rng = np.random.default_rng(1)
a = rng.standard_normal((257, 513)).astype(np.float32)
b = rng.standard_normal((129, 513)).astype(np.float32)
x = rng.standard_normal((1, 513)).astype(np.float32)
T = lambda m: mx.array(np.ascontiguousarray(m.T)).T  # the same values, stored transposed
f64 = lambda m: m.astype(np.float64)
out = {"status": mlxinfer.cpu.blas.status()}
for name, got, want in [
    ("a @ b.T", mx.matmul(mx.array(a), mx.array(b).T), f64(a) @ f64(b).T),
    ("b @ a.T", mx.matmul(mx.array(b), mx.array(a).T), f64(b) @ f64(a).T),
    ("batched", mx.matmul(mx.array(a[:256].reshape(4, 64, 513)), mx.array(b.T)),
     f64(a[:256]).reshape(4, 64, 513) @ f64(b).T),
    ("row @ b.T", mx.array(x) @ mx.array(b).T, f64(x) @ f64(b).T),
    ("row @ contiguous b.T", mx.array(x) @ mx.array(np.ascontiguousarray(b.T)), f64(x) @ f64(b).T),
    ("transposed row @ a.T", T(x) @ mx.array(a).T, f64(x) @ f64(a).T),
    ("2 + 0.5 row @ b.T", mx.addmm(mx.full((1, 129), 2.0), mx.array(x), mx.array(b).T, alpha=0.5, beta=1.0),
     2 + 0.5 * (f64(x) @ f64(b).T)),
]:
    got = np.array(got)
    out[name] = [got.dtype.name, bool(np.allclose(got, want, rtol=1e-4, atol=1e-3)), float(np.abs(got - want).max())]
print(json.dumps(out))
"""


@pytest.mark.slow
@fast_blas
def test_fast_blas_float32_matmul_matches_numpy(library):
    result = subprocess.run(
        [sys.executable, "-c", _MATMUL],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "MLXINFER_BLAS": library},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out.pop("status")["library"] == LIBRARIES[library][0]
    for name, (dtype, close, err) in out.items():
        assert dtype == "float32" and close, (name, err)


def test_auto_prefers_mkl_on_intel_and_openblas_elsewhere():
    assert blas._auto_order("GenuineIntel") == ["mkl", "openblas"]
    assert blas._auto_order("AuthenticAMD") == ["openblas", "mkl"]
    assert blas._auto_order("") == ["openblas", "mkl"]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="the preload is Linux-only")
def test_requested_library_missing_warns_once(tmp_path):
    # a virtualenv-like prefix with neither library: sys.prefix points there via a fresh interpreter flag
    code = (
        "import sys; sys.prefix = sys.argv[1]; sys.path = [p for p in sys.path if 'site-packages' not in p] "
        "+ [sys.argv[2]]; import json, mlxinfer; print(json.dumps(mlxinfer.cpu.blas.status()))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        env={**os.environ, "MLXINFER_BLAS": "openblas"},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["active"] is False and "openblas_shim" in status["reason"]
    _assert_one_warning(result, "MLXINFER_BLAS=openblas", "not built")


# ---------------------------------------------------------------- (d) the auto rule

GIB = 2**30


@pytest.mark.parametrize(
    "device, fast, model_bytes, ram, want",
    [
        ("cpu", True, 1 * GIB, 24 * GIB, "float32"),  # small model, fast BLAS, CPU
        ("cpu", True, 8 * GIB - 1, 24 * GIB, "float32"),  # just under a third
        ("cpu", True, 8 * GIB, 24 * GIB, "bfloat16"),  # a third is not "under a third"
        ("cpu", True, 30 * GIB, 24 * GIB, "bfloat16"),  # does not fit at all
        ("cpu", False, 1 * GIB, 24 * GIB, "bfloat16"),  # reference BLAS: float32 is not faster
        ("cpu", True, 1 * GIB, None, "bfloat16"),  # RAM unknown: keep as loaded
        ("gpu", True, 1 * GIB, 24 * GIB, "bfloat16"),  # Metal / CUDA: auto changes nothing
        ("gpu", False, 1 * GIB, 24 * GIB, "bfloat16"),
    ],
)
def test_auto_rule(device, fast, model_bytes, ram, want):
    dtype, why = auto_rule(device=device, fast_blas=fast, model_bytes_float32=model_bytes, ram_bytes=ram)
    assert dtype == want, why
    assert why


@pytest.mark.parametrize("ram", [3 * GIB, 8 * GIB, 16 * GIB, 24 * GIB, 96 * GIB, 10**10 + 1])
def test_auto_rule_threshold_is_a_third(ram):
    """The documented rule (docs/architecture.md), read as arithmetic, to the byte: float32 when its
    weights take under a third of physical RAM, as stored from a third on; the reason says 1/3."""
    below, third = (ram - 1) // 3, -(-ram // 3)  # the most bytes under a third; the fewest at a third or over
    facts = dict(device="cpu", fast_blas=True, ram_bytes=ram)
    assert auto_rule(model_bytes_float32=below, **facts)[0] == "float32"
    assert auto_rule(model_bytes_float32=third, **facts)[0] == "bfloat16"
    assert auto_rule(model_bytes_float32=2 * third, **facts)[0] == "bfloat16"
    for size in (below, third):
        assert "1/3 of RAM" in auto_rule(model_bytes_float32=size, **facts)[1]
    assert "under a third of physical RAM" in " ".join((ROOT / "docs" / "architecture.md").read_text().split())


def test_explicit_choices_pass_through_and_bad_ones_fail():
    assert choose_compute_dtype("float32", 10**15) == "float32"  # explicit: no RAM check
    assert choose_compute_dtype("bfloat16", 1) == "bfloat16"
    assert choose_compute_dtype("auto", 1) in ("float32", "bfloat16")
    with pytest.raises(MlxinferError, match="float16"):
        choose_compute_dtype("float16", 1)


# ---------------------------------------------------------------- (e) building the OpenBLAS shim

from mlxinfer.cpu import openblas_shim  # noqa: E402

needs_openblas_wheel = pytest.mark.skipif(
    sys.platform != "linux" or openblas_shim.openblas_library() is None, reason="scipy-openblas32 is not installed"
)


@needs_openblas_wheel
def test_shim_builds_and_exports_cblas_sgemm(tmp_path):
    import ctypes

    out = openblas_shim.build(out=str(tmp_path / "lib" / blas.SHIM_NAME))
    assert os.listdir(tmp_path / "lib") == [blas.SHIM_NAME]
    lib = ctypes.CDLL(out)  # RTLD_LOCAL: looked at, not made global
    assert hasattr(lib, "cblas_sgemm")


@needs_openblas_wheel
def test_shim_build_failure_is_one_line_and_leaves_nothing(tmp_path):
    with pytest.raises(MlxinferError) as e:
        openblas_shim.build(out=str(tmp_path / blas.SHIM_NAME), compiler="/bin/false")
    assert "building the OpenBLAS shim failed" in str(e.value) and "\n" not in str(e.value)
    assert os.listdir(tmp_path) == []  # no half-written library, no temp file


def test_shim_build_without_the_wheel_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setattr(openblas_shim, "openblas_library", lambda: None)
    monkeypatch.setattr(openblas_shim.sys, "platform", "linux")
    with pytest.raises(MlxinferError, match=r"pip install 'mlxinfer\[openblas\]'"):
        openblas_shim.build(out=str(tmp_path / blas.SHIM_NAME))
    assert os.listdir(tmp_path) == []
