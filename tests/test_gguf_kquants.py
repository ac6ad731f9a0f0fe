"""K-quant and i-quant GGUFs: each type's tensors against the gguf package's own dequantizer (bit for bit
where the rule keeps them exactly, within the re-fit bound where not), tiny Llama, Qwen3 and Qwen2 models
against the same models built from those float32 values, what `count` reads from their headers, and
one-line errors for the broken files."""

from __future__ import annotations

import json

import ggml_blocks
import mlx.core as mx
import warnings

import numpy as np
import pytest
from conftest import assert_one_line_error, invoke_cli

import checkpoints
import mlxinfer
from mlxinfer.formats.gguf import read_header
from mlxinfer.model import gguf_tensors
from mlxinfer.model.params import dequantize_module

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType
SIZES = gguf.constants.GGML_QUANT_SIZES  # (values per block, bytes per block), the package's own table

# the ggml structs' float16 fields (byte offsets) of the types whose random blocks the tests draw
F16_FIELDS = {"Q4_0": [0], "Q5_0": [0], "Q8_0": [0], "IQ4_NL": [0], "IQ4_XS": [0]}
F16_FIELDS |= {"Q4_1": [0, 2], "Q5_1": [0, 2], "Q4_K": [0, 2], "Q5_K": [0, 2]}
KQUANT = {"hidden_size": 256, "intermediate_size": 512, "rms_norm_eps": 1e-5}  # rows of whole 256-blocks
TINY = {
    "llama": dict(rope_scaling=None),
    "qwen3": dict(head_dim=64),
    "qwen2": {},
}


def _write(path, tensors: dict[str, tuple[str, np.ndarray]]):
    """A GGUF of raw tensors {name: (type, uint8 blocks of (rows, bytes per row))}, by the package's writer."""
    w = gguf.GGUFWriter(str(path), "llama")
    for name, (kind, raw) in tensors.items():
        w.add_tensor(name, raw, raw_dtype=Q[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _random_blocks(kind: str, rows: int, cols: int, rng) -> np.ndarray:
    """Random bytes for every field, the float16 scales drawn finite; where the layout's float16 fields
    are not listed, random blocks whose dequantized values are all finite and moderate."""
    block, size = SIZES[Q[kind]]
    n = rows * cols // block
    if kind in F16_FIELDS:
        raw = rng.integers(0, 256, (n, size), dtype=np.uint8)
        for at in F16_FIELDS[kind]:
            raw[:, at : at + 2] = (rng.standard_normal((n, 1)) * 0.01).astype(np.float16).view(np.uint8)
        return raw.reshape(rows, -1)
    keep = np.empty((0, size), np.uint8)
    while len(keep) < n:
        raw = rng.integers(0, 256, (4 * n, size), dtype=np.uint8)
        values = gguf.quants.dequantize(raw, Q[kind])
        keep = np.concatenate([keep, raw[np.isfinite(values).all(-1) & (np.abs(values).max(-1) < 1e4)]])
    return keep[:n].reshape(rows, -1)


def _loaded_values(parts: dict, cols: int) -> np.ndarray:
    """What a loaded tensor stands for: the affine dequantization with float32 scales (as every compute
    path widens them), or the float tensor itself."""
    if "scales" not in parts:
        return np.asarray(parts["weight"], np.float32)
    w, s, b = (mx.array(parts[k]) for k in ("weight", "scales", "biases"))
    bits = w.shape[-1] * 32 // cols
    return np.array(mx.dequantize(w, s.astype(mx.float32), b.astype(mx.float32), group_size=32, bits=bits))


def test_the_type_tables_agree_with_the_package():
    """ggml_types.py's tables (read without numpy, for count) against the gguf package's: every type id's
    name and block size (Q8_1 aside: the package says 40 bytes, ggml's block_q8_1 is 36), every file
    type id's enum name; the rule covers exactly the types model/gguf_tensors.py converts."""
    from mlxinfer.formats import ggml_types

    for type_id, (name, block, size) in ggml_types.GGML_TYPES.items():
        assert Q(type_id).name == name
        assert SIZES[Q(type_id)] == ((32, 40) if name == "Q8_1" else (block, size)), name
    assert set(ggml_types.GGML_TYPES) == {t.value for t in Q}
    for ftype, text in ggml_types.FILE_TYPES.items():  # "Q4_K - Medium" is MOSTLY_Q4_K_M, "all F32" ALL_F32
        enum = gguf.LlamaFileType(ftype).name.removeprefix("MOSTLY_")
        assert enum.split("_")[0].lower() == text.split()[0].split("_")[0].lower(), (ftype, enum, text)
        size = {" - Small": "_S", " - Large": "_L", " - Medium": "_M"}
        assert all(enum.endswith(v) for k, v in size.items() if k in text and enum != "Q2_K"), (enum, text)
    assert set(gguf_tensors.EXACT) == set(ggml_types.EXACT_BITS)
    assert ggml_types.loads_as("Q4_K") == "exact 4-bit g32" and ggml_types.loads_as("Q6_K") == "re-fit 8-bit g32"
    assert ggml_types.loads_as("Q8_K") == "not loaded"


@pytest.mark.parametrize("kind", sorted(ggml_blocks.WRITERS))
def test_block_writers_are_read_back_by_the_package(kind):
    """tests/ggml_blocks.py's layouts: the package's dequantizer gives the values back within the type's
    step (a swapped field or sub-block would be off by the values' own size), in its block size."""
    x = np.random.default_rng(3).standard_normal((6, 512)).astype(np.float32)
    raw = ggml_blocks.quantize(x, kind)
    block, size = SIZES[Q[kind]]
    assert raw.shape == (6, 512 // block * size)
    back = gguf.quants.dequantize(raw, Q[kind])
    rms = np.sqrt(np.mean((back - x) ** 2))
    bound = {"Q2_K": 0.45, "Q3_K": 0.25, "Q4_K": 0.12, "Q5_K": 0.06, "Q6_K": 0.03, "IQ4_NL": 0.12, "IQ4_XS": 0.12}
    assert rms < bound[kind], rms


@pytest.mark.parametrize("kind", sorted(gguf_tensors.EXACT))
def test_exact_types_equal_the_packages_dequantization_bit_for_bit(tmp_path, kind):
    """Random blocks (every code, every sub-block scale) and blocks of real-looking values: the MLX affine
    tensors the loader makes dequantize to exactly gguf-py's float32 values, at the rule's bit width."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 512)).astype(np.float32)
    tensors = {"random": (kind, _random_blocks(kind, 8, 512, rng))}
    if kind in ggml_blocks.WRITERS or kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        tensors["written"] = (kind, ggml_blocks.quantize(x, kind))
    header = read_header(_write(tmp_path / "t.gguf", tensors))
    loaded = gguf_tensors.read(header, set(tensors))
    for name, (_, raw) in tensors.items():
        want = gguf.quants.dequantize(raw, Q[kind])
        bits = loaded[name]["weight"].shape[-1] * 32 // 512
        assert bits == {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5}.get(kind, 8)
        np.testing.assert_array_equal(_loaded_values(loaded[name], 512), want)


@pytest.mark.parametrize("kind", sorted(gguf_tensors.REFIT))
def test_refit_types_stay_within_a_510th_of_each_groups_span(tmp_path, kind):
    """The re-fit 8-bit grid: every value within (max - min) / 510 of gguf-py's (half a step of a grid of
    255 steps over the group), plus float32 rounding."""
    rng = np.random.default_rng(5)
    raw = (
        ggml_blocks.quantize(rng.standard_normal((8, 512)).astype(np.float32), kind)
        if kind in ggml_blocks.WRITERS
        else _random_blocks(kind, 8, 512, rng)
    )
    header = read_header(_write(tmp_path / "t.gguf", {"t": (kind, raw)}))
    got = _loaded_values(gguf_tensors.read(header, {"t"})["t"], 512)
    want = gguf.quants.dequantize(raw, Q[kind])
    groups = want.reshape(8, 16, 32)
    span = (groups.max(-1) - groups.min(-1))[..., None]
    err = np.abs(got - want).reshape(8, 16, 32)
    assert (err <= _refit_bound(span, groups)).all(), (err / np.maximum(span, 1e-30)).max()


@pytest.mark.parametrize("kind", ["TQ1_0", "TQ2_0"])
def test_ternary_types_are_exact(tmp_path, kind):
    """Their values are -d, 0 and d; on the min-to-max grid every 0 fell between two codes, off by d / 255 and
    all the same way, so the errors added up in a matmul (KL 1.1 from llama.cpp's float32 on a TQ2_0 model,
    where every other type is within 1e-3). Written by gguf-py's own quantizer; equal bit for bit now."""
    x = np.random.default_rng(6).standard_normal((8, 512)).astype(np.float32)
    raw = gguf.quants.quantize(x, Q[kind])
    header = read_header(_write(tmp_path / "t.gguf", {"t": (kind, raw)}))
    want = gguf.quants.dequantize(raw, Q[kind])
    assert ((want == 0).mean() > 0.2) and len(np.unique(np.abs(want[0, :256]))) == 2  # 0 and one d a block
    np.testing.assert_array_equal(_loaded_values(gguf_tensors.read(header, {"t"})["t"], 512), want)


def test_a_corrupt_blocks_inf_scale_is_read_without_numpy_warnings(tmp_path):
    """A Q6_K block whose float16 d is inf: its values are inf and NaN, refused later in one line; the re-fit
    printed two RuntimeWarning lines (an invalid cast) before that line."""
    raw = _random_blocks("Q6_K", 2, 512, np.random.default_rng(7))
    at = 208  # ql (128 bytes), qh (64), 16 scales, then d
    raw.reshape(-1, SIZES[Q["Q6_K"]][1])[0, at : at + 2] = np.array([np.inf], np.float16).view(np.uint8)
    header = read_header(_write(tmp_path / "t.gguf", {"t": ("Q6_K", raw)}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = gguf_tensors.read(header, {"t"})["t"]
    assert not np.isfinite(_loaded_values(loaded, 512)).all()


def _refit_bound(span, values):
    """Half a step of 255 over the group's span, plus a few float32 roundings (of the step, the code's
    product, the sum) of the span and the value."""
    return span / 510 + 2.0**-21 * (span + np.abs(values))


def test_the_mx_load_types_read_both_ways_give_the_same_arrays(tmp_path):
    """A file of the types mx.load reads, read by the gguf package's path instead: the same arrays, bits
    and dtypes (float16 scales and biases, which hold Q4_0/Q4_1/Q8_0's exactly)."""
    rng = np.random.default_rng(6)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    tensors = {k: (k, gguf.quants.quantize(x, Q[k])) for k in ("Q4_0", "Q4_1", "Q8_0")}
    path = _write(tmp_path / "t.gguf", tensors)
    ours = gguf_tensors.read(read_header(path), set(tensors))
    theirs = mx.load(str(path))
    for name in tensors:
        for part, key in (("weight", name), ("scales", f"{name}.scales"), ("biases", f"{name}.biases")):
            a, b = mx.array(ours[name][part]), theirs[key]
            assert a.dtype == b.dtype and mx.array_equal(a, b).item(), (name, part)


# ---- tiny models -----------------------------------------------------------------------------------------


def _q4_k_m(name: str, shape) -> str:
    """llama.cpp's Q4_K_M mix, in short: Q6_K for the output table, attn_v and ffn_down, Q4_K elsewhere."""
    return "Q6_K" if name.startswith(("output.", "blk.0.attn_v", "blk.1.ffn_down")) else "Q4_K"


def _exact_mix(name: str, shape) -> str:
    """Only types the rule keeps exactly: Q5_K, IQ4_XS, Q8_0 and IQ4_NL in places, Q4_K elsewhere."""
    part = name.split(".")[-2]
    return {"attn_q": "Q5_K", "attn_k": "IQ4_XS", "ffn_up": "Q8_0", "attn_output": "IQ4_NL"}.get(part, "Q4_K")


MIXES = {  # name -> (type per tensor, general.file_type or None)
    "Q4_K_M": (_q4_k_m, 15),
    "exact": (_exact_mix, None),
    "low": (lambda name, shape: "Q2_K" if "ffn" in name else "Q3_K", 12),
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """tiny(arch, mix) -> (gguf path, HF directory of gguf-py's float32 values, written float32 values)."""
    root, made = tmp_path_factory.mktemp("kquants"), {}

    def get(arch: str, mix: str):
        if (arch, mix) not in made:
            hf = checkpoints.write_checkpoint(root / arch, arch, dtype=mx.float32, **KQUANT, **TINY[arch])
            path = root / f"{arch}-{mix}.gguf"
            kind, file_type = MIXES[mix]
            checkpoints.write_gguf(hf, path, kind, file_type)
            made[arch, mix] = path, _dequantized_twin(path, hf, root / f"{arch}-{mix}-f32")
        return made[arch, mix]

    return get


def _dequantized_twin(path, hf_dir, out):
    """The HF checkpoint with every tensor replaced by gguf-py's float32 dequantization of the GGUF's
    (llama's q/k rows put back by the inverse of convert_hf_to_gguf.py's permutation)."""
    import shutil

    shutil.copytree(hf_dir, out)
    cfg = json.loads((hf_dir / "config.json").read_text())
    values = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in gguf.GGUFReader(str(path)).tensors}
    weights = {}
    for name in mx.load(str(hf_dir / "model.safetensors")):
        v = values[checkpoints.gguf_name(name)].reshape(-1) if name.endswith("norm.weight") else None
        v = values[checkpoints.gguf_name(name)] if v is None else v
        heads = {"q_proj": cfg["num_attention_heads"], "k_proj": cfg["num_key_value_heads"]}
        proj = name.rsplit(".", 2)[-2]
        if cfg["model_type"] == "llama" and proj in heads and name.endswith(".weight"):
            h = heads[proj]
            v = v.reshape(h, v.shape[0] // h // 2, 2, -1).swapaxes(1, 2).reshape(v.shape)
        weights[name] = mx.array(np.ascontiguousarray(v, np.float32))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    return out


def _logits(model, tokenizer):
    return model(mx.array([tokenizer.encode(checkpoints.CORPUS[0])]))[0].astype(mx.float32)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "qwen2"])
@pytest.mark.parametrize("mix", ["exact", "Q4_K_M"])
def test_tiny_kquant_model_against_its_dequantized_float32_twin(tiny, arch, mix):
    """Loaded weights against gguf-py's (exact types bit for bit, the re-fit ones within their bound);
    logits in float32 against the twin built from gguf-py's values: equal to the bit for the exact mix,
    close with the same top-1 for Q4_K_M (its Q6_K tensors are re-fit to 8 bits). `@float32` loads the
    twin's weights exactly."""
    path, twin = tiny(arch, mix)
    model, tok = mlxinfer.load(path, compute_dtype="bfloat16")
    ref_model, ref_tok = mlxinfer.load(twin, compute_dtype="float32")
    reference = dict(__import__("mlx.utils", fromlist=["tree_flatten"]).tree_flatten(ref_model.parameters()))
    exact = {t.name for t in read_header(path).tensors if t.type_name in gguf_tensors.EXACT}
    for hf_path, m in model.named_modules():
        if hasattr(m, "scales"):
            got, want = np.array(dequantize_module(m)), np.array(reference[f"{hf_path}.weight"])
            if checkpoints.gguf_name(f"{hf_path}.weight") in exact:
                np.testing.assert_array_equal(got, want, err_msg=hf_path)
            else:
                groups = want.reshape(want.shape[0], -1, 32)
                span = (groups.max(-1) - groups.min(-1))[..., None]
                assert (np.abs(got - want).reshape(groups.shape) <= _refit_bound(span, groups)).all(), hf_path
    f32, _ = mlxinfer.load(path, compute_dtype="float32")
    a, b = _logits(f32, tok), _logits(ref_model, ref_tok)
    if mix == "exact":
        assert mx.array_equal(a, b).item()
    else:
        assert mx.abs(a - b).max().item() < 2e-2 * mx.abs(b).max().item()
        assert mx.array_equal(mx.argmax(a, -1), mx.argmax(b, -1)).item()
    dq, _ = mlxinfer.load(f"{path}@float32", compute_dtype="float32")
    assert mx.array_equal(_logits(dq, tok), b).item()
    assert dq.info.source.dequantized and dq.info.weights == "float32"


def test_compute_paths_on_a_kquant_model(tiny):
    """--compute-dtype on top: the quantized path keeps the 4- and 8-bit layers packed and gives the float32
    path's top-1; a 5-bit layer (Q5_K, a layout the kernel does not take) keeps `auto` off the quantized
    path, and `quantized` dequantizes that layer alone."""
    from mlxinfer.cpu import qmm
    from mlxinfer.model import convert

    path, _ = tiny("qwen3", "Q4_K_M")
    f32, tok = mlxinfer.load(path, compute_dtype="float32")
    stored, _ = mlxinfer.load(path, compute_dtype="bfloat16")
    assert convert.quantizable(stored)  # 4- and 8-bit groups of 32 only
    five, _ = mlxinfer.load(tiny("qwen3", "exact")[0], compute_dtype="bfloat16")
    assert not convert.quantizable(five)
    auto, _ = mlxinfer.load(tiny("qwen3", "exact")[0], compute_dtype="auto")
    assert auto.info.compute_dtype != "quantized"
    if not qmm.available():
        pytest.skip(f"the quantized matmul kernel is not available here: {qmm.status()['reason']}")
    q, _ = mlxinfer.load(path, compute_dtype="quantized")
    assert q.info.compute_dtype == "quantized" and "4/8-bit" in q.info.weights
    a, b = _logits(q, tok), _logits(f32, tok)
    assert mx.abs(a - b).max().item() < 1e-3 * mx.abs(b).max().item()
    assert mx.array_equal(mx.argmax(a, -1), mx.argmax(b, -1)).item()
    q5, _ = mlxinfer.load(tiny("qwen3", "exact")[0], compute_dtype="quantized")
    assert q5.info.compute_dtype == "quantized"


def test_low_bit_kquants_load_and_run(tiny):
    """Q2_K and Q3_K everywhere (re-fit to 8 bits): the float32 path's logits within 5% of the twin's largest
    and the same top-1 at 80% of positions or more (a random model's scores are flat: the re-fit flips some)."""
    path, twin = tiny("llama", "low")
    model, tok = mlxinfer.load(path, compute_dtype="float32")
    ref, _ = mlxinfer.load(twin, compute_dtype="float32")
    a, b = _logits(model, tok), _logits(ref, tok)
    assert mx.abs(a - b).max().item() < 5e-2 * mx.abs(b).max().item()
    assert (mx.argmax(a, -1) == mx.argmax(b, -1)).mean().item() >= 0.8


def test_convert_writes_the_loaded_tensors_that_mlx_lm_runs(tiny, tmp_path):
    """`convert` of a Q4_K_M file: a directory of the tensors the loader keeps (float32 scales, 4- and 8-bit
    groups), whose logits in mlxinfer and in mlx-lm's own loader equal the GGUF's as stored, to the bit."""
    from mlx_lm import load as mlx_lm_load

    from mlxinfer_quant import convert_gguf

    path, _ = tiny("llama", "Q4_K_M")
    summary = convert_gguf(path, tmp_path / "out")
    assert "Q4_K exact 4-bit g32" in summary["policy"] and "Q6_K re-fit 8-bit g32" in summary["policy"]
    gguf_model, tok = mlxinfer.load(path, compute_dtype="bfloat16")
    want = _logits(gguf_model, tok)
    ours, _ = mlxinfer.load(tmp_path / "out", compute_dtype="bfloat16")
    peer, _ = mlx_lm_load(str(tmp_path / "out"))
    assert mx.array_equal(_logits(ours, tok), want).item()
    assert mx.array_equal(_logits(peer, tok), want).item()


def test_convert_into_the_folder_of_its_gguf_is_refused(tiny, tmp_path):
    """Was: `convert P/m.gguf P --force` replaced P, the GGUF with it, then said "no GGUF file at P/m.gguf"."""
    import shutil

    path, _ = tiny("llama", "Q4_K_M")
    folder = tmp_path / "P"
    folder.mkdir()
    shutil.copy(path, folder / "m.gguf")
    before = (folder / "m.gguf").read_bytes()
    refused = invoke_cli("convert", str(folder / "m.gguf"), str(folder), "--force")
    assert_one_line_error(refused, "holds the source model")
    assert sorted(p.name for p in folder.iterdir()) == ["m.gguf"] and (folder / "m.gguf").read_bytes() == before


# ---- count ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mix,name", [("Q4_K_M", "Q4_K - Medium"), ("low", "Q3_K - Medium")])
def test_count_reads_bytes_and_bits_per_weight_as_llama_cpp_prints_them(tiny, mix, name):
    """Bytes per type from the package's block sizes, the file's size, llama.cpp's BPW (all tensor bytes x 8 /
    all values) and its file type name, in the text and the JSON."""
    path, _ = tiny("llama", mix)
    tensors = gguf.GGUFReader(str(path)).tensors
    per_type: dict[str, int] = {}
    for t in tensors:
        block, size = SIZES[t.tensor_type]
        per_type[t.tensor_type.name] = per_type.get(t.tensor_type.name, 0) + int(t.n_elements) // block * size
    total_bytes, values = sum(per_type.values()), sum(int(t.n_elements) for t in tensors)
    report = json.loads(invoke_cli("count", str(path), "--json").stdout)
    q = report["quantization"]
    assert {k: v["bytes"] for k, v in q["types"].items()} == per_type
    assert q["bytes"] == total_bytes and q["bits_per_parameter"] == pytest.approx(8 * total_bytes / values)
    assert q["file_type"] == name
    assert report["stored"]["file_bytes"] == path.stat().st_size
    assert report["stored"]["header_bytes"] == path.stat().st_size - total_bytes
    text = invoke_cli("count", str(path)).stdout
    assert f"file size = {total_bytes / 2**20:.2f} MiB ({8 * total_bytes / values:.2f} BPW)" in text
    assert f"file type = {name}" in text


def test_quality_names_a_kquant_file_as_llama_cpp_does_in_one_short_cell(tiny):
    """quality's weights cell for a K-quant file listed every layer that differed from the most common
    setting (~3,000 characters for SmolLM2's Q4_K_M, breaking its table) and called it by that setting; it
    is llama.cpp's file type now, then the tables by setting, counted."""
    from mlxinfer_quant.quality import weights_summary

    named = weights_summary(mlxinfer.load(str(tiny("llama", "Q4_K_M")[0]))[0])
    assert named.startswith("GGUF Q4_K - Medium, as 4-bit g32") and len(named) < 200, named
    mixed = weights_summary(mlxinfer.load(str(tiny("llama", "exact")[0]), compute_dtype="bfloat16")[0])
    assert mixed.endswith(" tables") and " x" in mixed and "model.layers" not in mixed and len(mixed) < 200, mixed


def test_count_guesses_the_file_type_as_llama_cpp_does(tiny):
    """No general.file_type: the file type of the type most tensors have, '(guessed)'. The llama mix has 8
    Q4_K tensors and 5 F32 norms; Qwen3 (tied tables, q/k norms) has 7 Q4_K to 9 F32 (llama.cpp says "all F32")."""
    for arch, name in (("llama", "Q4_K - Medium (guessed)"), ("qwen3", "all F32 (guessed)")):
        path, _ = tiny(arch, "exact")
        types = [t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors]
        assert (types.count("Q4_K"), types.count("F32")) == ((8, 5) if arch == "llama" else (7, 9))
        report = json.loads(invoke_cli("count", str(path), "--json").stdout)
        assert report["quantization"]["file_type"] == name and report["quantization"]["file_type_id"] is None


# ---- bad input --------------------------------------------------------------------------------------------


def test_a_truncated_kquant_tensor(tiny, tmp_path):
    path, _ = tiny("llama", "Q4_K_M")
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:-1000])
    last = max(read_header(path).tensors, key=lambda t: t.offset)
    result = invoke_cli("topk", "--model", str(cut), "--prompt", "hi")
    assert_one_line_error(result, "truncated", last.name, "re-download")


def _patched(path, out, name: str, dims=None, type_id=None):
    """A copy of the GGUF with one tensor's dims or type id changed in its tensor table (its data as it was)."""
    raw = bytearray(path.read_bytes())
    key = name.encode()
    at = raw.index(len(key).to_bytes(8, "little") + key) + 8 + len(key)  # then n_dims (u32), dims (u64 each), type
    n_dims = int.from_bytes(raw[at : at + 4], "little")
    if dims is not None:
        assert len(dims) == n_dims
        raw[at + 4 : at + 4 + 8 * n_dims] = b"".join(d.to_bytes(8, "little") for d in dims)
    if type_id is not None:
        raw[at + 4 + 8 * n_dims : at + 8 + 8 * n_dims] = type_id.to_bytes(4, "little")
    out.write_bytes(bytes(raw))
    return out


def test_a_kquant_row_that_is_no_whole_number_of_blocks(tiny, tmp_path):
    """A Q4_K tensor whose rows hold 128 values (half a block): one line naming the tensor and the fix."""
    path, _ = tiny("llama", "Q4_K_M")
    bad = _patched(path, tmp_path / "bad.gguf", "blk.0.ffn_up.weight", dims=[128, 1024])
    for command in (("count", str(bad)), ("topk", "--model", str(bad), "--prompt", "hi")):
        assert_one_line_error(invoke_cli(*command), "blk.0.ffn_up.weight", "Q4_K", "256-value blocks", "re-quantize")


def test_count_says_a_tensor_holds_fewer_values_than_the_config_implies(tiny, tmp_path):
    """A tensor's rows edited to fewer (whole blocks still): count said "-256 parameters stored beyond the
    count"; it says how many fewer, that a shape does not match the file's metadata, and what to do."""
    path, _ = tiny("llama", "Q4_K_M")
    rows, cols = next(t.shape for t in read_header(path).tensors if t.name == "blk.0.ffn_up.weight")
    bad = _patched(path, tmp_path / "bad.gguf", "blk.0.ffn_up.weight", dims=[cols, rows - 1])  # one row fewer
    report = json.loads(invoke_cli("count", str(bad), "--json").stdout)
    notes = " ".join(report["stored"]["notes"])
    assert f"{cols:,} parameters fewer stored than the config implies" in notes and "re-convert" in notes


def test_an_unknown_type(tiny, tmp_path):
    """A type id ggml does not define: one line at the header (count too), naming the tensor and the fix."""
    path, _ = tiny("llama", "Q4_K_M")
    bad = _patched(path, tmp_path / "bad.gguf", "blk.0.ffn_up.weight", type_id=99)
    for command in (("count", str(bad)), ("topk", "--model", str(bad), "--prompt", "hi")):
        assert_one_line_error(invoke_cli(*command), "blk.0.ffn_up.weight", "unknown ggml type 99", "llama-quantize")


def test_a_type_the_package_cannot_dequantize(tmp_path):
    """Q8_K (ggml's activation type, which no quantizer writes to a file): count reads the file, loading it
    is one line naming the tensor and the fix."""
    hf = checkpoints.write_checkpoint(tmp_path / "hf", "llama", dtype=mx.float32, **KQUANT, **TINY["llama"])
    path = tmp_path / "q8k.gguf"
    checkpoints.write_gguf(hf, path, lambda name, shape: "Q8_K" if "ffn_up" in name else "Q4_K")
    report = json.loads(invoke_cli("count", str(path), "--json").stdout)
    assert report["quantization"]["types"]["Q8_K"]["tensors"] == 2
    result = invoke_cli("topk", "--model", str(path), "--prompt", "hi")
    assert_one_line_error(result, ".ffn_up.weight", "Q8_K", "cannot dequantize", "llama-quantize")


def test_another_gguf_architecture_is_one_line_pointing_at_its_safetensors(tiny, tmp_path):
    """A GGUF of an architecture the loader does not map (gemma3 here: the same tensors, relabelled) is one
    line naming it and the way that runs it: the safetensors checkpoint on mlx-lm's class."""
    path, _ = tiny("qwen3", "Q4_K_M")
    raw = path.read_bytes()
    key = b"general.architecture"
    at = raw.index(len(key).to_bytes(8, "little") + key) + 8 + len(key) + 4  # then the string's length and bytes
    assert raw[at : at + 8 + 5] == (5).to_bytes(8, "little") + b"qwen3"
    bad = tmp_path / "other.gguf"
    bad.write_bytes(raw[:at] + (6).to_bytes(8, "little") + b"gemma3" + raw[at + 13 :])
    result = invoke_cli("topk", "--model", str(bad), "--prompt", "hi")
    assert_one_line_error(result, "unknown architecture 'gemma3'", "safetensors", "mlx-lm")


def test_llama3_rope_frequencies_are_applied(tmp_path):
    """A Llama 3.1-style GGUF stores its RoPE scaling as rope_freqs.weight (one factor per rotary pair): it
    loads to the logits of its HF twin (rope_scaling llama3, factor 8, original context 64), in a K-quant
    file as in F32; factors that no Llama 3 scaling gives are one line."""
    hf = checkpoints.write_checkpoint(tmp_path / "hf", "llama", dtype=mx.float32, **KQUANT)
    assert json.loads((hf / "config.json").read_text())["rope_scaling"]["rope_type"] == "llama3"
    want_model, tok = mlxinfer.load(hf, compute_dtype="float32")
    want = _logits(want_model, tok)
    flat = tmp_path / "f32.gguf"
    written = checkpoints.write_gguf(hf, flat)
    factors = written["rope_freqs.weight"]
    assert factors[0] == 1.0 and factors[-1] == 8.0 and ((factors > 1) & (factors < 8)).any()  # a ramp between
    model, _ = mlxinfer.load(flat, compute_dtype="float32")
    assert model.config.rope_scaling["original_max_position_embeddings"] == 64
    assert mx.abs(_logits(model, tok) - want).max().item() < 1e-4
    plain = tmp_path / "plain"
    checkpoints.write_checkpoint(plain, "llama", dtype=mx.float32, **KQUANT, rope_scaling=None)
    unscaled, _ = mlxinfer.load(plain, compute_dtype="float32")
    assert mx.abs(_logits(unscaled, tok) - want).max().item() > 1e-2  # the scaling matters at these positions
    quantized = tmp_path / "q4k.gguf"
    checkpoints.write_gguf(hf, quantized, _q4_k_m)
    q, _ = mlxinfer.load(quantized, compute_dtype="float32")
    assert q.config.rope_scaling == model.config.rope_scaling
    notes = json.loads(invoke_cli("count", str(quantized), "--json").stdout)["stored"]["notes"]
    assert any("rope_freqs.weight" in n for n in notes) and any("stored exactly once" in n for n in notes)
    raw = bytearray(flat.read_bytes())
    at = bytes(raw).index(factors.tobytes())
    raw[at : at + 4] = np.float32(3.0).tobytes()  # the first pair, which Llama 3 never scales
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(bytes(raw))
    assert_one_line_error(invoke_cli("topk", "--model", str(bad), "--prompt", "hi"), "rope_freqs.weight", "Llama 3")


def test_linear_rope_scaling_from_the_metadata(tmp_path):
    """{arch}.rope.scaling.type linear with its factor: the logits of the twin built from gguf-py's values
    with the HF config (rope_scaling linear, factor 4); yarn, which the model does not apply, is one line."""
    hf = checkpoints.write_checkpoint(
        tmp_path / "hf",
        "qwen3",
        dtype=mx.float32,
        **KQUANT,
        **TINY["qwen3"],
        rope_scaling={"rope_type": "linear", "factor": 4.0},
    )
    _, tok = mlxinfer.load(hf, compute_dtype="float32")
    checkpoints.write_gguf(hf, tmp_path / "linear.gguf", _q4_k_m)
    model, _ = mlxinfer.load(tmp_path / "linear.gguf", compute_dtype="float32")
    assert model.config.rope_scaling == {"rope_type": "linear", "factor": 4.0}
    twin = _dequantized_twin(tmp_path / "linear.gguf", hf, tmp_path / "twin")
    ref, _ = mlxinfer.load(twin, compute_dtype="float32")
    a, b = _logits(model, tok), _logits(ref, tok)
    assert mx.abs(a - b).max().item() < 2e-2 * mx.abs(b).max().item()
    yarn = tmp_path / "hf-yarn"
    checkpoints.write_checkpoint(yarn, "qwen3", dtype=mx.float32, **KQUANT, **TINY["qwen3"])
    cfg = json.loads((yarn / "config.json").read_text())
    (yarn / "config.json").write_text(json.dumps({**cfg, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}))
    checkpoints.write_gguf(yarn, tmp_path / "yarn.gguf", _q4_k_m)
    result = invoke_cli("topk", "--model", str(tmp_path / "yarn.gguf"), "--prompt", "hi")
    assert_one_line_error(result, "rope.scaling.type 'yarn'", "safetensors")


@pytest.mark.parametrize("mix", ["exact", "Q4_K_M", "low"])
def test_count_ranks_cuts_where_the_loader_keeps_whole_groups(tiny, mix):
    """`count --ranks` plans its cuts by the group size the loader gives each K-quant and i-quant layer
    (32), read from the loaded model itself; it used to take only Q4_0, Q4_1 and Q8_0 as grouped."""
    from mlxinfer.counting.split import column_groups
    from mlxinfer.formats.gguf import config_from_header

    path, _ = tiny("qwen3", mix)
    model, _ = mlxinfer.load(path, compute_dtype="bfloat16")
    header = read_header(path)
    layer = model.model.layers[0]
    want = {
        "o_proj": getattr(layer.self_attn.o_proj, "group_size", 1),
        "down_proj": getattr(layer.mlp.down_proj, "group_size", 1),
    }
    assert want["down_proj"] == 32, want  # the tiny mixes quantize it
    assert column_groups(config_from_header(header), header=header) == want
