"""Qwen2 and Qwen3 GGUF files against their safetensors twins.

Every other GGUF the tests write is a Llama, so the Qwen paths of the GGUF loader (the architecture
names, q/k/v biases, Qwen3's per-head q/k norms and its head_dim from attention.key_length, no row
permutation) ran nowhere. Each twin is written as llama.cpp's converter writes it, with the tensor
names gguf-py's own TensorNameMap gives for that architecture (not mlxinfer's table), in F32, so the
loaded model must equal the safetensors one to float32 rounding.
"""

from __future__ import annotations

import json

import mlx.core as mx
import numpy as np
import pytest

import checkpoints
import mlxinfer

gguf = pytest.importorskip("gguf")
ARCHS = {"qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3}


def write_gguf_twin(hf_dir, out, arch: str) -> None:
    cfg = json.loads((hf_dir / "config.json").read_text())
    names = gguf.get_tensor_name_map(ARCHS[arch], cfg["num_hidden_layers"])
    w = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[ARCHS[arch]])
    checkpoints.write_gguf_metadata(w, hf_dir)  # the tokenizer's own pre-tokenizer (a real Qwen file says qwen2)
    if cfg.get("head_dim"):  # as convert_hf_to_gguf.py writes an explicit head_dim
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    for name, value in mx.load(str(hf_dir / "model.safetensors")).items():
        module, part = name.rsplit(".", 1)
        w.add_tensor(f"{names.get_name(module)}.{part}", np.array(value.astype(mx.float32)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_a_qwen_gguf_equals_its_safetensors_twin(tmp_path, arch):
    hf_dir = checkpoints.write_checkpoint(tmp_path / "hf", arch, dtype=mx.float32)
    write_gguf_twin(hf_dir, tmp_path / "twin.gguf", arch)
    hf_model, hf_tok = mlxinfer.load(hf_dir, compute_dtype="float32")
    gg_model, gg_tok = mlxinfer.load(tmp_path / "twin.gguf", compute_dtype="float32")
    assert gg_model.config.model_type == arch and gg_model.config.head_dim == hf_model.config.head_dim
    assert (hf_model.config.head_dim == 48) is (arch == "qwen3")  # Qwen3's head_dim is not hidden / heads here
    stored = {t.name for t in gguf.GGUFReader(str(tmp_path / "twin.gguf")).tensors}
    qwen_part = {"qwen2": "blk.0.attn_q.bias", "qwen3": "blk.0.attn_q_norm.weight"}[arch]
    assert qwen_part in stored  # the part only this architecture has, read (the logits below depend on it)
    ids = hf_tok.encode(checkpoints.CORPUS[2])
    assert gg_tok.encode(checkpoints.CORPUS[2]) == ids
    x = mx.array([ids])
    assert mx.abs(gg_model(x) - hf_model(x)).max().item() < 1e-4
    a = mlxinfer.generate(hf_model, hf_tok, ids, max_tokens=8, chat=False, settings={"temperature": 0.0})
    b = mlxinfer.generate(gg_model, gg_tok, ids, max_tokens=8, chat=False, settings={"temperature": 0.0})
    assert a.tokens == b.tokens


def test_a_qwen3_gguf_without_key_length_takes_llama_cpps_head_dim(tmp_path):
    """Without attention.key_length llama.cpp takes n_embd / n_head; Hugging Face's Qwen3Config default of
    128 (what a config.json without head_dim gets) must not reach a GGUF."""
    hf_dir = checkpoints.write_checkpoint(tmp_path / "hf", "qwen3", dtype=mx.float32, head_dim=None)
    cfg = json.loads((hf_dir / "config.json").read_text())
    write_gguf_twin(hf_dir, tmp_path / "twin.gguf", "qwen3")  # head_dim None: no key_length written
    model, _ = mlxinfer.load(tmp_path / "twin.gguf", compute_dtype="float32")
    assert model.config.head_dim == cfg["hidden_size"] // cfg["num_attention_heads"] != 128
