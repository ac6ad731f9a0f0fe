"""quant: affine error bounds, parity with mlx-lm's convert, exact GGUF conversion, both loaders,
the quality report's ordering, `count` on the written directories, and one-line errors."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_one_line_error, invoke_cli

import mlxinfer
import mlxinfer_quant as quant
from mlxinfer.errors import MlxinferError
from mlxinfer.model.weights import unpermute_rows
from mlxinfer_quant import writer
from mlxinfer_quant.affine import dequantize_tensor, module_weight, quantize_tensor, tables
from mlxinfer_quant.export import convert_gguf, load, quantize

IDS = mx.array([[1, 504, 2705, 314, 253, 1028, 28]])
TINY_IDS = mx.array([[1, 5, 17, 42, 99, 120, 7, 300, 2]])
BF16_U = 2.0**-8  # unit roundoff of bfloat16 (8 significant bits)


def _load_dir(path: Path) -> dict[str, mx.array]:
    out = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        out.update(mx.load(str(f)))
    return out


def _config(path: Path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())


def _logits_equal_in_both_loaders(path: Path, ids: mx.array) -> mx.array:
    import mlx_lm

    ours, _ = load(path)  # mlxinfer.load, weights as stored
    peer, _ = mlx_lm.load(str(path))
    a, b = ours(ids), peer(ids)
    mx.eval(a, b)
    assert a.shape == b.shape
    assert mx.array_equal(a, b).item(), float(mx.abs(a - b).max())
    return a


# ---- the affine bound ----------------------------------------------------------------------------------


def _check_bound(w: mx.array, bits: int, group_size: int) -> float:
    """Per group: |w - dequantized| <= one step (max - min) / (2^bits - 1), plus, for bf16 storage, the
    rounding of the scale (times q <= 2^bits - 1) and of the bias. Returns the worst error / bound."""
    q, s, b = quantize_tensor(w, group_size, bits)
    assert s.dtype == w.dtype and b.dtype == w.dtype and q.dtype == mx.uint32
    rows = w.shape[0]
    wn = np.array(w.astype(mx.float32)).reshape(rows, -1, group_size)
    back = np.array(dequantize_tensor(q, s, b, group_size, bits)).reshape(rows, -1, group_size)
    step = (wn.max(-1) - wn.min(-1)) / (2**bits - 1)
    if w.dtype == mx.float32:
        bound = step * (1 + 1e-6) + 1e-7 * np.abs(wn).max(-1)
    else:
        sn, bn = (np.abs(np.array(x.astype(mx.float32))) for x in (s, b))
        bound = step + (2**bits - 1) * BF16_U * sn + BF16_U * bn
    err = np.abs(back - wn).max(-1)
    assert (err <= bound).all(), (bits, group_size, float((err / np.maximum(bound, 1e-30)).max()))
    return float((err / np.maximum(bound, 1e-30)).max())


@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float32])
def test_affine_error_within_bound_random(dtype):
    for bits in quant.VALID_BITS:
        for group_size in quant.VALID_GROUP_SIZES:
            rng = np.random.default_rng(bits * 1000 + group_size)
            w = rng.standard_normal((32, 512)).astype(np.float32) * 0.05
            w[::7, ::13] *= 40  # outliers stretch some groups
            w[3, :group_size] = 0.3  # a constant group
            w[5, :group_size] = np.abs(w[5, :group_size]) + 1  # far from zero, one sign
            w[6, :group_size] = -np.abs(w[6, :group_size]) - 1
            _check_bound(mx.array(w).astype(dtype), bits, group_size)


@pytest.mark.slow
def test_affine_error_within_bound_real_weights(embedded):
    """The embedded SmolLM2's weights in bf16 (as `quantize` sees them), requantized."""
    model, _ = embedded
    mods = tables(model)
    for path in (
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.self_attn.k_proj",
        "model.layers.15.mlp.down_proj",
        "model.layers.29.mlp.up_proj",
    ):
        w = module_weight(mods[path], mx.bfloat16)
        for bits, group_size in ((4, 32), (4, 64), (4, 128), (8, 64), (3, 64), (6, 128)):
            if w.shape[1] % group_size == 0:  # 576 inputs: 128 fits only down_proj's 1536
                _check_bound(w, bits, group_size)
    embed = module_weight(mods["model.embed_tokens"], mx.bfloat16)[:4096]
    for bits, group_size in ((4, 64), (8, 32)):
        _check_bound(embed, bits, group_size)


# ---- parity with mlx-lm ----------------------------------------------------------------------------------


def _mlx_lm_convert(src: Path, out: Path, bits: int, group_size: int, predicate=None) -> Path:
    from mlx_lm.convert import convert

    convert(str(src), str(out), quantize=True, q_bits=bits, q_group_size=group_size, quant_predicate=predicate)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch,bits,group_size,head_bits",
    [
        ("llama", 4, 64, None),
        ("llama", 8, 32, None),
        ("qwen3", 4, 64, None),
        ("qwen2", 3, 32, None),
        ("llama", 4, 64, 8),
        ("qwen3", 4, 32, 8),
        ("llama", 5, 128, 16),
    ],
)
def test_same_tensors_as_mlx_lm_convert(checkpoint_dir, tmp_path, arch, bits, group_size, head_bits):
    src = checkpoint_dir(arch)
    tied = _config(src)["tie_word_embeddings"]
    head = "model.embed_tokens" if tied else "lm_head"

    def predicate(path, module):  # what mlx-lm is told for the same policy
        if path == head and head_bits is not None:
            return False if head_bits == 16 else {"group_size": group_size, "bits": head_bits}
        return True

    ours = tmp_path / "ours"
    summary = quantize(src, ours, bits=bits, group_size=group_size, head_bits=head_bits)
    peer = _mlx_lm_convert(src, tmp_path / "peer", bits, group_size, predicate if head_bits else None)
    a, b = _load_dir(ours), _load_dir(peer)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert mx.array_equal(a[name], b[name]).item(), name
    block, peer_block = _config(ours)["quantization"], _config(peer)["quantization"]
    assert {k: block[k] for k in ("group_size", "bits", "mode")} == {
        "group_size": group_size,
        "bits": bits,
        "mode": "affine",
    }
    assert {k: v for k, v in block.items() if v is not False} == peer_block  # mlx-lm omits a float module
    if head_bits == 16:
        assert block[head] is False and f"{head}.scales" not in a
    elif head_bits:
        assert block[head] == {"group_size": group_size, "bits": head_bits}
    assert _config(ours)["quantization_config"] == block
    assert summary["tensor_bytes"] == sum(v.nbytes for v in a.values())
    _logits_equal_in_both_loaders(ours, TINY_IDS)


@pytest.mark.slow
def test_sharded_output_loads_and_counts(checkpoint_dir, tmp_path):
    out = tmp_path / "sharded"
    result = invoke_cli(
        "quantize",
        str(checkpoint_dir("llama")),
        str(out),
        "--bits",
        "8",
        "--group-size",
        "32",
        "--max-shard-size",
        "40KB",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards == sorted(p.name for p in out.glob("model-*.safetensors"))
    assert not (out / "model.safetensors").exists()
    assert index["metadata"]["total_size"] == summary["tensor_bytes"]
    assert index["metadata"]["total_parameters"] == summary["parameters"]
    _logits_equal_in_both_loaders(out, TINY_IDS)
    _check_count(out, summary)


@pytest.mark.slow
def test_quantize_report_option(checkpoint_dir, tmp_path):
    result = invoke_cli(
        "quantize",
        str(checkpoint_dir("qwen3")),
        str(tmp_path / "q"),
        "--bits",
        "4",
        "--group-size",
        "32",
        "--report",
        "--max-tokens",
        "80",
        "--window",
        "32",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)["report"]
    assert report["tokens"] == 80 and report["positions"] == 31 + 31 + 15  # windows of 32, 32 and 16
    (row,) = report["candidates"]
    assert row["kl_mean"] > 0 and 0 <= row["top1_agreement"] <= 1 and row["perplexity"] > 1
    assert row["bits_per_weight"] < report["reference"]["bits_per_weight"] == 16.0


# ---- the embedded model: bf16, requantized, converted ---------------------------------------------------


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    """The embedded SmolLM2 as a bf16 directory, 4-bit and 8-bit requantizations of it, and its GGUF converted."""
    root = tmp_path_factory.mktemp("smol")
    dirs = {"bf16": root / "bf16", "q4": root / "q4", "q8": root / "q8", "gguf": root / "gguf"}
    summaries = {"bf16": quantize(None, dirs["bf16"], bits=16)}
    summaries["q4"] = quantize(dirs["bf16"], dirs["q4"], bits=4, group_size=64, head_bits=16)
    summaries["q8"] = quantize(dirs["bf16"], dirs["q8"], bits=8, group_size=64)
    summaries["gguf"] = convert_gguf(None, dirs["gguf"])
    return dirs, summaries


@pytest.mark.slow
def test_gguf_becomes_bf16(smol, embedded):
    dirs, summaries = smol
    cfg = _config(dirs["bf16"])
    assert cfg["torch_dtype"] == "bfloat16" and "quantization" not in cfg and "quantization_config" not in cfg
    tensors = _load_dir(dirs["bf16"])
    assert {v.dtype for v in tensors.values()} == {mx.bfloat16}
    model, _ = embedded
    for path, m in tables(model).items():  # each weight: the GGUF's values in float32, rounded once to bf16
        assert mx.array_equal(tensors[path + ".weight"], module_weight(m, mx.bfloat16)).item(), path
    assert summaries["bf16"]["bits_per_weight"] == 16.0
    assert sorted(p.name for p in dirs["bf16"].iterdir()) == [
        "chat_template.jinja",
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    _logits_equal_in_both_loaders(dirs["bf16"], IDS)


@pytest.mark.slow
def test_gguf_conversion_is_exact(smol, embedded):
    dirs, _ = smol
    out = dirs["gguf"]
    model, tokenizer = embedded
    from mlx.utils import tree_flatten

    stored = _load_dir(out)
    ours = dict(tree_flatten(model.parameters()))  # the same (Hugging Face) names
    assert sorted(stored) == sorted(ours)
    for name, v in ours.items():  # packed weights, scales, biases and float32 norms: bit for bit
        assert stored[name].dtype == v.dtype and mx.array_equal(stored[name], v).item(), name
    cfg = _config(out)
    assert cfg["quantization"] == {
        "group_size": 32,
        "bits": 4,
        "mode": "affine",
        "model.embed_tokens": {"group_size": 32, "bits": 8},
    }
    assert stored["model.norm.weight"].dtype == mx.float32

    # the dequantized values equal llama.cpp's own dequantization (gguf-py), q/k rows back in HF order
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(str(model.info.source.path))
    wanted = {
        "token_embd.weight": ("model.embed_tokens", None),
        "blk.0.attn_q.weight": ("model.layers.0.self_attn.q_proj", cfg["num_attention_heads"]),
        "blk.7.attn_k.weight": ("model.layers.7.self_attn.k_proj", cfg["num_key_value_heads"]),
        "blk.29.ffn_down.weight": ("model.layers.29.mlp.down_proj", None),
    }
    for t in reader.tensors:
        if t.name not in wanted:
            continue
        name, heads = wanted[t.name]
        reference = mx.array(gguf.quants.dequantize(t.data, t.tensor_type))
        if heads:
            reference = unpermute_rows(reference, heads)
        w = stored[f"{name}.weight"]
        bits = w.shape[1] * 32 // reference.shape[1]
        values = dequantize_tensor(w, stored[f"{name}.scales"], stored[f"{name}.biases"], 32, bits)
        assert mx.array_equal(values, reference).item(), t.name

    # the converted directory computes what the GGUF computes; mlx-lm agrees
    assert mx.array_equal(_logits_equal_in_both_loaders(out, IDS), model(IDS)).item()

    # tokenizer files and chat template written out: same ids, same prompt
    _, tok = load(out)
    text = "Hello world, 12345 it's  a test\n\n<|im_start|>user"
    assert tok.encode(text) == tokenizer.encode(text)
    messages = [{"role": "user", "content": "Name one fruit."}]
    assert tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert (out / "chat_template.jinja").exists()
    assert set(tok.eos_token_ids) == set(tokenizer.eos_token_ids)


@pytest.mark.slow
def test_quality_orders_8bit_above_4bit(smol):
    dirs, _ = smol
    result = invoke_cli("quality", str(dirs["bf16"]), str(dirs["q4"]), str(dirs["q8"]), "--max-tokens", "64", "--json")
    assert result.returncode == 0, result.stderr
    r = json.loads(result.stdout)
    assert r["tokens"] == 64 and r["positions"] == 63 and r["text"] == "eval.txt"
    q4, q8 = r["candidates"]
    assert q8["kl_mean"] < q4["kl_mean"]
    assert q8["top1_agreement"] > q4["top1_agreement"]
    assert q8["bytes"] > q4["bytes"] and r["reference"]["bytes"] > q8["bytes"]
    for row in (r["reference"], q4, q8):
        assert 1 < row["perplexity"] < 1000
    assert abs(q8["perplexity"] - r["reference"]["perplexity"]) < abs(q4["perplexity"] - r["reference"]["perplexity"])


def test_shipped_text_is_a_few_thousand_tokens(embedded):
    _, tokenizer = embedded
    n = len(tokenizer.encode((Path(quant.__file__).parent / "data" / "eval.txt").read_text()))
    assert 2000 <= n <= 6000


# ---- count reads what was written -----------------------------------------------------------------------


def _check_count(path: Path, summary: dict, cli: bool = False) -> dict:
    """`count DIR --json`: the command (in this process) when cli, else the function it calls."""
    if cli:
        result = invoke_cli("count", str(path), "--json")
        assert result.returncode == 0, result.stderr
        r = json.loads(result.stdout)
    else:
        r = json.loads(json.dumps(mlxinfer.count(str(path)).to_dict()))
    stored = r["stored"]
    files = sorted(p for p in Path(path).glob("*.safetensors"))
    assert stored["file_bytes"] == sum(p.stat().st_size for p in files)
    assert stored["tensor_bytes"] == summary["tensor_bytes"]
    assert r["total"] == summary["parameters"]
    return r


@pytest.mark.slow
def test_count_matches_the_written_files(smol, checkpoint_dir, tmp_path):
    dirs, summaries = smol
    # quantized (with a float output table) and float: the bytes count expects are the bytes stored
    for key in ("bf16", "q4", "q8"):
        r = _check_count(dirs[key], summaries[key], cli=key == "q4")
        expected = r["quantization"]["bytes"] if r["quantization"] else r["bytes"]
        assert r["stored"]["tensor_bytes"] == expected, key
    assert _config(dirs["q4"])["quantization"] == {
        "group_size": 64,
        "bits": 4,
        "mode": "affine",
        "model.embed_tokens": False,
    }
    for arch, policy in (
        ("llama", {"bits": 4, "head_bits": 8}),
        ("qwen3", {"bits": 6, "head_bits": 16}),
        ("qwen2", {"bits": 8, "group_size": 32, "embed_bits": 4}),
    ):
        out = tmp_path / arch
        r = _check_count(out, quantize(checkpoint_dir(arch), out, **policy))
        assert r["stored"]["tensor_bytes"] == r["quantization"]["bytes"], arch
    # the GGUF conversion keeps its norms in float32 while its scales are float16 (config torch_dtype);
    # count prices every float tensor at torch_dtype, so it expects 2 bytes less per norm weight
    r = _check_count(dirs["gguf"], summaries["gguf"])
    cfg = _config(dirs["gguf"])
    norm_params = (2 * cfg["num_hidden_layers"] + 1) * cfg["hidden_size"]
    assert r["stored"]["tensor_bytes"] - r["quantization"]["bytes"] in (0, 2 * norm_params)


# ---- bad input ------------------------------------------------------------------------------------------


def _no_leftovers(parent: Path, name: str) -> None:
    assert not (parent / name).exists()
    assert not [p.name for p in parent.iterdir() if p.name.startswith(f".{name}.")]


@pytest.mark.parametrize(
    "args,fragments",
    [
        (["--bits", "7"], ["--bits 7", "1, 2, 3, 4, 5, 6, 8"]),
        (["--group-size", "48"], ["--group-size 48", "32, 64, 128"]),
        (["--head-bits", "7"], ["--head-bits 7"]),
        (["--bits", "16", "--head-bits", "8"], ["--head-bits 8", "quantized"]),
        (["--dtype", "int8"], ["--dtype int8"]),
        (["--max-shard-size", "lots"], ["size"]),
        (["--report", "--max-tokens", "0"], ["--max-tokens must be 2 or more"]),  # was: after OUT was written
        (["--report", "--window", "1"], ["--window must be 2"]),
        (["--max-tokens", "8"], ["--report"]),  # was: ignored
    ],
)
def test_bad_options_are_one_line_errors(checkpoint_dir, tmp_path, args, fragments):
    result = invoke_cli("quantize", str(checkpoint_dir("llama")), str(tmp_path / "out"), *args)
    assert_one_line_error(result, *fragments)
    assert not (tmp_path / "out").exists()  # nothing written half-way
    _no_leftovers(tmp_path, "out")


def test_group_size_must_divide_every_layer(checkpoint_dir, tmp_path):
    # the tiny qwen3 has 4 heads of 48: o_proj's input is 192, which 128 does not divide
    result = invoke_cli("quantize", str(checkpoint_dir("qwen3")), str(tmp_path / "out"), "--group-size", "128")
    assert_one_line_error(result, "model.layers.0.self_attn.o_proj", "192", "group size 128", "--group-size 32 or 64")
    _no_leftovers(tmp_path, "out")


@pytest.mark.slow
def test_existing_output_needs_force(checkpoint_dir, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = invoke_cli("quantize", str(checkpoint_dir("llama")), str(out))
    assert_one_line_error(result, str(out), "not empty", "--force")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    result = invoke_cli("convert", "embedded", str(out))
    assert_one_line_error(result, "not empty", "--force")
    result = invoke_cli("quantize", str(checkpoint_dir("llama")), str(out), "--force", "--json")
    assert result.returncode == 0, result.stderr
    assert not (out / "keep.txt").exists() and (out / "config.json").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    # an empty directory is fine without --force; a file is not a directory
    (tmp_path / "empty").mkdir()
    assert invoke_cli("quantize", str(checkpoint_dir("llama")), str(tmp_path / "empty")).returncode == 0
    (tmp_path / "file").write_text("x")
    result = invoke_cli("quantize", str(checkpoint_dir("llama")), str(tmp_path / "file"))
    assert_one_line_error(result, "not a directory")


def test_an_output_that_is_a_link_to_a_directory_is_written_through(checkpoint_dir, tmp_path):
    """OUT a symbolic link to an empty directory: the model is written into the directory it names and the
    link stays (it was refused as "not a directory"); a link to nothing is refused, naming its target."""
    (tmp_path / "target").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "target")
    result = invoke_cli("quantize", str(checkpoint_dir("llama")), str(tmp_path / "link"), "--bits", "8")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "link").is_symlink() and (tmp_path / "target" / "config.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "target"]  # no partial left beside
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    result = invoke_cli("convert", "embedded", str(tmp_path / "dangling"))
    assert_one_line_error(result, "symbolic link to", "gone")
    assert not (tmp_path / "gone").exists()


def test_force_that_is_not_a_bool_replaces_nothing(checkpoint_dir, tmp_path):
    """Was: quantize(..., force="no") read as true: the directory and what it held replaced."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    for run in (lambda: quantize(checkpoint_dir("llama"), out, force="no"), lambda: convert_gguf(None, out, force=1)):
        with pytest.raises(MlxinferError, match="force must be True or False"):
            run()
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_convert_needs_a_gguf(checkpoint_dir, tmp_path):
    """Each wrong source says that convert reads a .gguf file (the loader's own messages pointed at a model
    directory); '@float32' was ignored, and the file's 4-bit weights written under a float32 request."""
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.txt").write_text("hi")
    for source, said in [
        (str(checkpoint_dir("llama")), "is a directory; convert reads a .gguf file"),
        (str(tmp_path / "empty"), "is a directory; convert reads a .gguf file"),
        (str(tmp_path / "notes.txt"), "is not a .gguf file; convert reads .gguf files"),
        (str(tmp_path / "missing"), "missing; convert reads a .gguf file"),
        ("embedded@float32", "drop '@float32'"),
    ]:
        result = invoke_cli("convert", source, str(tmp_path / "out"))
        assert_one_line_error(result, said)
        _no_leftovers(tmp_path, "out")
    from mlxinfer_quant.export import _check_gguf_path  # a folder holding one .gguf is that file, as load reads it

    (tmp_path / "holder").mkdir()
    (tmp_path / "holder" / "model.gguf").symlink_to(mlxinfer.embedded_model_path())
    _check_gguf_path(tmp_path / "holder")


def test_failure_leaves_nothing_half_written(checkpoint_dir, tmp_path, monkeypatch):
    def broken(directory, config):
        (directory / "config.json").write_text("{")
        raise OSError("disk full")

    monkeypatch.setattr(writer, "save_config", broken)
    out = tmp_path / "new" / "out"
    with pytest.raises(MlxinferError, match="cannot write out .*disk full"):  # one line, not an OSError
        quantize(checkpoint_dir("llama"), out)
    assert not (tmp_path / "new").exists()  # the parent it created is gone too
    # but not what another run or the user put there meanwhile (was: the parent removed with its files)

    def meanwhile(directory, config):
        (tmp_path / "deep" / "keep.txt").write_text("theirs")
        raise OSError("disk full")

    monkeypatch.setattr(writer, "save_config", meanwhile)
    with pytest.raises(MlxinferError, match="disk full"):
        quantize(checkpoint_dir("llama"), tmp_path / "deep" / "er" / "out")
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["keep.txt"]  # "er", empty, is gone
    monkeypatch.setattr(writer, "save_config", broken)
    source = checkpoint_dir("llama")

    def full_after_one(self, mode=0o777, parents=False, exist_ok=False):  # a disk that fills after one folder
        os.mkdir(tmp_path / "half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(Path, "mkdir", full_after_one)
        with pytest.raises(MlxinferError, match="No space left on device"):
            quantize(source, tmp_path / "half" / "way" / "out")
    assert not (tmp_path / "half").exists()  # was: kept, the loop stopped at the folder never made
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    with pytest.raises(MlxinferError, match="disk full"):
        quantize(checkpoint_dir("llama"), existing, force=True)
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "existing"]


def test_a_full_disk_under_the_tokenizer_is_an_oserror(tmp_path):
    """The Rust tokenizers say a full disk as a plain Exception ("... (os error 28)"): was a traceback, past the
    one-line error every other write gets."""
    import errno
    from types import SimpleNamespace

    def full(path):
        raise Exception("No space left on device (os error 28)")

    tok = SimpleNamespace(_tokenizer=SimpleNamespace(save_pretrained=full))
    with pytest.raises(OSError) as caught:
        writer.save_gguf_tokenizer(tok, tmp_path, None)
    assert caught.value.errno == errno.ENOSPC and "tokenizer.json" in caught.value.filename


def test_weights_that_cannot_be_written_are_an_output_error_and_leave_nothing(checkpoint_dir, tmp_path):
    """MLX says only '[write] Unable to write N bytes'; a write refused (here a file-size limit, EFBIG) is
    the place's fault, not the input's: exit 1, one line, no OUT left. (On a full disk it says so.)"""
    import resource
    import signal
    import subprocess
    import sys

    from conftest import ROOT

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails instead of a kill
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    out = tmp_path / "q"
    proc = subprocess.run(
        [sys.executable, "-m", "mlxinfer", "quantize", str(checkpoint_dir("llama")), str(out), "--bits", "4"],
        cwd=ROOT, capture_output=True, text=True, preexec_fn=small_files, timeout=300,
    )  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert not out.exists()


def test_convert_into_the_current_folder_from_a_relative_source(tmp_path):
    """`cd empty; mlxinfer convert ../m.gguf .` wrote OUT, then failed ('no GGUF file at ../m.gguf', exit 2):
    OUT replaced the folder the relative path was read from, and the summary read the source's size after."""
    import subprocess
    import sys

    (tmp_path / "m.gguf").symlink_to(mlxinfer.embedded_model_path())
    here = tmp_path / "empty"
    here.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "mlxinfer", "convert", "../m.gguf", ".", "--json"],
        cwd=here, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert Path(summary["out"]).resolve() == here.resolve() and summary["source_bytes"] > 0
    assert (here / "model.safetensors").is_file()


def test_quantizing_a_quantized_source_in_more_bits_says_it_adds_nothing(checkpoint_dir, tmp_path):
    """A 4-bit folder written as 8-bit is 4-bit weights dequantized and stored in twice the bytes: said in a
    note (mlx-lm's convert keeps the 4-bit layers without a word); a float source in 4 bits says nothing."""
    four = str(checkpoint_dir("llama", 4, 64))
    result = invoke_cli("quantize", four, str(tmp_path / "eight"), "--bits", "8", "--json")
    assert result.returncode == 0, result.stderr
    [note] = json.loads(result.stdout)["notes"]
    assert "dequantized and quantized again" in note
    text = invoke_cli("quantize", four, str(tmp_path / "eight-text"), "--bits", "8").stdout
    assert text.splitlines()[-1].startswith("note: the source holds 4.")
    plain = invoke_cli("quantize", str(checkpoint_dir("llama")), str(tmp_path / "four"), "--json")
    assert json.loads(plain.stdout)["notes"] == []
    # as floats (a reference, a bf16 copy) nothing is quantized again: the note says what the floats are
    floats = invoke_cli("quantize", four, str(tmp_path / "bf16"), "--bits", "16", "--json")
    [note] = json.loads(floats.stdout)["notes"]
    assert "bfloat16 weights are its values dequantized" in note and "quantize the float" not in note


@pytest.mark.parametrize("out, kind", [("out.gguf", "file"), ("Q8_0", "type"), ("q4_k_m", "type")])
def test_llama_quantizes_habits_are_not_taken_as_the_folder(tmp_path, monkeypatch, out, kind):
    """Was: `quantize model.gguf Q8_0` wrote a 4-bit MLX folder named Q8_0, and `... out.gguf` a folder named so."""
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(invoke_cli("quantize", "embedded", out), f"OUT {out} reads as a GGUF {kind}")
    assert list(tmp_path.iterdir()) == []
