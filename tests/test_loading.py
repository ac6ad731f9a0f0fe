"""Loaders: GGUF tensors and headers against gguf-py, a tiny GGUF model against its HF twin,
hub repo ids through an offline cache, and one-line errors for broken inputs."""

from __future__ import annotations

import json
import time
import shutil

import mlx.core as mx
import numpy as np
import checkpoints
import pytest
from conftest import assert_one_line_error, invoke_cli, run_cli

import mlxinfer
from mlxinfer.formats.gguf import read_header
from mlxinfer.formats.sources import embedded_model_path

gguf = pytest.importorskip("gguf")
Q = gguf.GGMLQuantizationType


def _bits(packed: mx.array, n_cols: int) -> int:
    return packed.shape[-1] * 32 // n_cols


@pytest.mark.parametrize(
    "qtype,tolerance",
    [(Q.F32, 0.0), (Q.F16, 1e-3), (Q.Q8_0, 1 / 127 / 2), (Q.Q4_1, 1 / 15 * 2 / 2), (Q.Q4_0, 1 / 8)],
)
def test_gguf_tensor_round_trip(tmp_path, qtype, tolerance):
    """Source values come back within each type's step; quantized ones equal gguf-py's own dequantize."""
    rng = np.random.default_rng(1)
    src = rng.uniform(-1, 1, size=(8, 64)).astype(np.float32)
    path = tmp_path / "t.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    if qtype in (Q.F32, Q.F16):
        writer.add_tensor("t", src.astype(np.float16 if qtype == Q.F16 else np.float32))
    else:
        writer.add_tensor("t", gguf.quants.quantize(src, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    loaded = mx.load(str(path))
    if "t.scales" in loaded:
        w, s, b = loaded["t"], loaded["t.scales"], loaded["t.biases"]
        values = np.array(mx.dequantize(w, s, b, group_size=32, bits=_bits(w, 64)).astype(mx.float32))
        reference = gguf.quants.dequantize(gguf.quants.quantize(src, qtype), qtype)
        np.testing.assert_allclose(values, reference, atol=2e-3, rtol=2e-3)  # f16 scale/bias arithmetic
    else:
        values = np.array(loaded["t"].astype(mx.float32))
    # the step of each type, relative to a block's range of [-1, 1]
    assert np.abs(values - src).max() <= tolerance + 2e-3


@pytest.mark.slow
def test_gguf_header_matches_gguf_py():
    path = embedded_model_path()
    ours = read_header(path)
    peer = gguf.GGUFReader(str(path))
    assert len(ours.tensors) == len(peer.tensors)
    for a, b in zip(ours.tensors, peer.tensors):
        assert a.name == b.name
        assert a.shape == tuple(int(d) for d in reversed(b.shape.tolist()))
        assert a.type_name == b.tensor_type.name
        assert ours.data_offset + a.offset == int(b.data_offset)
    assert ours.metadata["llama.block_count"] == 30
    assert ours.metadata["tokenizer.ggml.tokens"][2] == "<|im_end|>"


def test_tiny_gguf_equals_its_hf_twin(tmp_path):
    """Un-permuting llama.cpp's q/k rows and rebuilding the tokenizer give back the HF model exactly."""
    hf_dir = checkpoints.write_checkpoint(tmp_path / "hf", "llama", dtype=mx.float32, rope_scaling=None)
    checkpoints.write_gguf(hf_dir, tmp_path / "twin.gguf")  # F32, q/k rows permuted as llama.cpp's converter does
    hf_model, hf_tok = mlxinfer.load(hf_dir)
    gg_model, gg_tok = mlxinfer.load(tmp_path / "twin.gguf")
    for text in checkpoints.CORPUS[:4] + ["  spaces\tand\nnewlines 12345 ünïcödé"]:
        assert gg_tok.encode(text) == hf_tok.encode(text), text
    messages = [{"role": "user", "content": "Name one fruit."}]
    assert gg_tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = mx.array([hf_tok.encode(checkpoints.CORPUS[0])])
    assert mx.abs(gg_model(ids) - hf_model(ids)).max().item() < 1e-4


def _hub_cache(tmp_path, repo_id, model_dir):
    """A Hugging Face hub cache holding one snapshot of `model_dir`, as huggingface_hub lays it out."""
    home = tmp_path / "hf"
    repo = home / "hub" / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(model_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return home


@pytest.mark.slow
def test_repo_id_loads_from_offline_hub_cache(tmp_path, checkpoint_dir):
    local = checkpoint_dir("qwen3")
    home = _hub_cache(tmp_path, "tiny-org/tiny-qwen3", local)
    env = {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    by_repo = run_cli("topk", "--model", "tiny-org/tiny-qwen3", "--prompt", "Name one fruit.", "--json", env=env)
    by_path = run_cli("topk", "--model", str(local), "--prompt", "Name one fruit.", "--json")
    assert by_repo.returncode == 0, by_repo.stderr
    a, b = json.loads(by_repo.stdout), json.loads(by_path.stdout)
    assert a["rows"] == b["rows"] and a["prompt_ids"] == b["prompt_ids"]
    assert a["model"] == "tiny-org/tiny-qwen3"


@pytest.mark.slow
def test_repo_id_not_cached_while_offline(tmp_path):
    env = {"HF_HOME": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    result = run_cli("topk", "--model", "nobody/missing-model", "--prompt", "hi", env=env)
    assert_one_line_error(result, "nobody/missing-model", "offline")


def _broken(tmp_path, checkpoint_dir, change):
    bad = tmp_path / "bad"
    shutil.copytree(checkpoint_dir("llama"), bad)
    change(bad)
    return bad


def _edit_config(**fields):
    def change(d):
        cfg = json.loads((d / "config.json").read_text())
        cfg.update(fields)
        (d / "config.json").write_text(json.dumps(cfg))

    return change


@pytest.mark.parametrize(
    "change,fragments",
    [
        (lambda d: (d / "config.json").unlink(), ["config.json"]),
        (_edit_config(model_type="not_a_model"), ["unknown architecture", "not_a_model", "mlx-lm"]),
        (_edit_config(intermediate_size=320), ["shape", "mlp"]),
        (_edit_config(vocab_size=200), ["shape", "embed_tokens"]),
        (lambda d: (d / "config.json").write_text("{not json"), ["not valid JSON"]),
        (lambda d: (d / "model.safetensors").write_bytes(b"\x10\x00\x00"), ["safetensors"]),
        (_edit_config(hidden_size=None), ["hidden_size"]),
        # was: GPTQ's block read as MLX's (bits, group_size), then a missing tensor named
        (_edit_config(quantization_config={"quant_method": "gptq", "bits": 4, "group_size": 128}), ["'gptq'", "GGUF"]),
        (_edit_config(quantization={"bits": 4, "group_size": 32, "mode": "junk"}), ["mode 'junk'", "affine, mxfp4"]),
        (_edit_config(quantization={"bits": 4, "group_size": 32, "mode": "mxfp4"}), ["mxfp4", "affine weights only"]),
    ],
    ids=[
        "no-config",
        "unknown-arch",
        "shape-mismatch",
        "vocab-shape",
        "config-not-json",
        "corrupt-weights",
        "null-field",
        "gptq",
        "unknown-mode",
        "mxfp4-on-ours",
    ],
)
def test_broken_checkpoints_give_one_line_errors(tmp_path, checkpoint_dir, change, fragments):
    bad = _broken(tmp_path, checkpoint_dir, change)
    assert_one_line_error(invoke_cli("topk", "--model", str(bad), "--prompt", "hi"), *fragments)


@pytest.mark.slow
def test_truncated_gguf(tmp_path):
    cut = tmp_path / "cut.gguf"
    with open(embedded_model_path(), "rb") as f:
        cut.write_bytes(f.read(5_000_000))
    assert_one_line_error(run_cli("topk", "--model", str(cut), "--prompt", "hi"), "truncated")


def test_missing_path():
    assert_one_line_error(invoke_cli("topk", "--model", "./no/such/dir", "--prompt", "hi"), "no model at")


@pytest.mark.slow
def test_count_of_a_cached_repo_with_the_hub_out_of_reach(tmp_path, checkpoint_dir):
    """Not offline, but the hub does not resolve: the cached config.json, at once (no ~23 s of retries)."""
    home = _hub_cache(tmp_path, "tiny-org/tiny-qwen3", checkpoint_dir("qwen3"))
    env = {"HF_HOME": str(home), "HF_ENDPOINT": "http://hub.invalid", "HF_HUB_OFFLINE": "0"}
    result = run_cli("count", "tiny-org/tiny-qwen3", "--json", env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["source"] == "hub" and report["total"] > 0
    assert any("headers not read" in n for n in report["notes"])


def _serve_badly(answer: bytes | None):
    """A loopback "hub" that takes connections and answers `answer` to each (None: never a byte), as hotel
    Wi-Fi or a captive portal does: (its URL, a function that stops it)."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held, stopped = [], threading.Event()

    def run():
        server.settimeout(0.2)
        while not stopped.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)
            if answer is not None:
                conn.recv(65536)
                conn.sendall(answer)
                conn.close()

    threading.Thread(target=run, daemon=True).start()

    def stop():
        stopped.set()
        for conn in held:
            conn.close()
        server.close()

    return f"http://127.0.0.1:{server.getsockname()[1]}", stop


PORTAL = b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 30\r\n\r\n<html>Sign in to Wi-Fi!</html>"


@pytest.mark.slow
@pytest.mark.parametrize("answer", [None, PORTAL], ids=["stalls", "portal"])
def test_a_cached_repo_loads_when_the_hub_stalls_or_is_a_portal(tmp_path, checkpoint_dir, answer):
    """Was: a network that took the connection and never answered held `topk` on a cached model for ever
    (huggingface_hub's first request has no timeout), and a captive portal's page was "could not download".
    Now one bounded request (HUB_TIMEOUT_S) tells the hub apart, and the cache answers."""
    home = _hub_cache(tmp_path, "tiny-org/tiny-qwen3", checkpoint_dir("qwen3"))
    url, stop = _serve_badly(answer)
    try:
        env = {"HF_HOME": str(home), "HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0"}
        started = time.monotonic()
        result = run_cli("topk", "-m", "tiny-org/tiny-qwen3", "-p", "hi", "--json", env=env, timeout=120)
        took = time.monotonic() - started
        missing = run_cli("topk", "-m", "tiny-org/not-cached", "-p", "hi", env=env, timeout=120)
    finally:
        stop()
    assert result.returncode == 0 and json.loads(result.stdout)["model"] == "tiny-org/tiny-qwen3", result.stderr
    assert took < 60, took
    assert_one_line_error(missing, "tiny-org/not-cached", "not in the local Hugging Face cache")


def test_a_model_larger_than_the_memory_is_refused_before_it_is_read(checkpoint_dir, monkeypatch):
    """Was: a model past the memory read until MLX failed mid-read (a traceback) or the process was killed."""
    from mlxinfer.model import dtype_rule

    monkeypatch.setattr(dtype_rule, "physical_ram_bytes", lambda: 100_000)  # the tiny llama holds ~2 MB
    with pytest.raises(mlxinfer.MlxinferError, match=r"weights take [\d.]+ MB but this machine has 0\.1 MB"):
        mlxinfer.load(checkpoint_dir("llama"))


def test_a_folder_of_ggufs_or_a_gguf_beside_a_config_says_which_to_load(checkpoint_dir, tmp_path):
    """Was: 'no config.json in' a folder of two .gguf files; 'download the model's weights' beside a .gguf."""
    embedded = mlxinfer.embedded_model_path()
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).symlink_to(embedded)
    assert_one_line_error(invoke_cli("count", str(two)), "holds 2 .gguf files (a.gguf, b.gguf)", "name the one")
    beside = tmp_path / "beside"
    beside.mkdir()
    shutil.copy(checkpoint_dir("llama") / "config.json", beside)
    (beside / "model.gguf").symlink_to(embedded)
    assert_one_line_error(invoke_cli("topk", "-m", str(beside), "-p", "hi"), "no *.safetensors", "model.gguf itself")


def test_a_quantized_tensors_shape_is_said_in_values_not_packed_words(tmp_path, checkpoint_dir):
    """A 4-bit table of the wrong vocabulary: the message gives (rows, hidden) for both sides, as config.json
    says them; it gave the packed uint32 columns (hidden / 8)."""
    bad = tmp_path / "bad"
    shutil.copytree(checkpoint_dir("llama", 4, 64), bad)
    cfg = json.loads((bad / "config.json").read_text())
    V, D = cfg["vocab_size"], cfg["hidden_size"]
    _edit_config(vocab_size=V + 64)(bad)
    result = invoke_cli("topk", "--model", str(bad), "--prompt", "hi")
    assert_one_line_error(result, f"'model.embed_tokens.weight' has shape ({V}, {D})", f"implies ({V + 64}, {D})")
