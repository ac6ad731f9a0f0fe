"""The forward pass against mlx-lm's own model classes, and the KV cache against a full pass."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from conftest import VARIANTS

import mlxinfer

IDS = mx.array([[1, 17, 42, 99, 250, 3, 7, 120, 64, 2, 33, 180, 5, 9, 11, 300]])


def max_abs_diff(a: mx.array, b: mx.array) -> float:
    return mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max().item()


@pytest.mark.parametrize("arch,bits,group_size", VARIANTS)
def test_logits_equal_mlx_lm_exactly(checkpoint_dir, arch, bits, group_size):
    import mlx_lm

    path = checkpoint_dir(arch, bits, group_size)
    ours, _ = mlxinfer.load(path, compute_dtype="bfloat16")
    peer, _ = mlx_lm.load(str(path))
    scores = ours(IDS)
    assert scores.shape == (1, IDS.shape[1], ours.config.vocab_size)
    assert max_abs_diff(scores, peer(IDS)) == 0.0


@pytest.mark.parametrize(
    "arch,bits,group_size", [("llama", None, None), ("llama", 4, 64), ("qwen3", None, None), ("qwen3", 8, 64)]
)
def test_kv_cache_matches_full_pass(checkpoint_dir, arch, bits, group_size):
    model, _ = mlxinfer.load(checkpoint_dir(arch, bits, group_size), compute_dtype="bfloat16")
    full = model(IDS)[0]
    cache = model.make_cache()
    model(IDS[:, :9], cache)  # prefill of many positions
    for n in range(9, IDS.shape[1]):  # then one position at a time
        step = model(IDS[:, n : n + 1], cache)[0, -1]
        assert max_abs_diff(step, full[n]) < 1e-2, n  # bf16 activations
    assert cache[0].offset == IDS.shape[1]


@pytest.mark.parametrize("bits,group_size", [(4, 64), (8, 32)])
def test_quantized_weights_dequantize_to_their_source(checkpoint_dir, bits, group_size):
    """A quantized checkpoint holds its bf16 source within the affine bound.

    MLX's affine grid puts the group's larger-magnitude extreme exactly on the bias, so the
    worst error is one step (the far extreme can be clipped), half a step inside the grid;
    bf16 storage of scale and bias adds relative rounding of 2**-8 on each.
    """
    source = mx.load(str(checkpoint_dir("llama") / "model.safetensors"))
    model, _ = mlxinfer.load(checkpoint_dir("llama", bits, group_size), compute_dtype="bfloat16")
    checked = 0
    for name, module in model.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            assert (module.bits, module.group_size) == (bits, group_size)
            w = mx.dequantize(module.weight, module.scales, module.biases, group_size, bits).astype(mx.float32)
            ref = source[f"{name}.weight"].astype(mx.float32)  # the same (Hugging Face) names
            groups = ref.reshape(ref.shape[0], -1, group_size)
            step = (groups.max(-1) - groups.min(-1)) / (2**bits - 1)  # (rows, groups)
            scale = mx.abs(module.scales.astype(mx.float32))
            rounding = (mx.abs(module.biases.astype(mx.float32)) + (2**bits - 1) * scale) * 2.0**-8
            err = mx.abs(w - ref).reshape(groups.shape).max(-1)
            assert mx.all(err <= step + rounding).item(), name
            if bits == 4:  # at 8 bits the step is as fine as bf16 itself
                assert mx.mean(err / step).item() < 0.75, name  # typical groups stay well inside
            checked += 1
    assert checked == 2 * 7 + 2  # seven linears per layer, embedding and output table


def test_embedded_model_shape(embedded):
    model, tokenizer = embedded
    cfg = model.config
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size) == ("llama", 30, 576, 49152)
    assert cfg.tie_word_embeddings
    assert len(tokenizer) == 49152


@pytest.mark.slow
def test_embedded_gguf_equals_mlx_lm_fed_the_same_weights(embedded):
    """Our GGUF path against mlx-lm's llama class given the same (un-permuted) tensors."""
    from mlxinfer.model.peers import mlx_lm_twin

    model, tokenizer = embedded
    peer = mlx_lm_twin(model)
    ids = mx.array([tokenizer.encode("The cat sat on the mat because it was warm and")])
    a, b = model(ids), peer(ids)
    assert max_abs_diff(a, b) <= 1e-3
    assert mx.array_equal(mx.argmax(a, -1), mx.argmax(b, -1)).item()


@pytest.mark.parametrize("arch,bits,group_size", [("llama", None, None), ("qwen3", 4, 128), ("qwen2", None, None)])
def test_twin_equals_mlx_lm_load(checkpoint_dir, arch, bits, group_size):
    """The peer built from our model is mlx-lm's own model: same logits as mlx_lm.load."""
    import mlx_lm

    from mlxinfer.model.peers import mlx_lm_twin

    path = checkpoint_dir(arch, bits, group_size)
    ours, _ = mlxinfer.load(path, compute_dtype="bfloat16")
    loaded, _ = mlx_lm.load(str(path))
    assert max_abs_diff(mlx_lm_twin(ours)(IDS), loaded(IDS)) == 0.0


# the same pass in a process of its own: its own load of the weights, its own threads and random state
_ANOTHER_PASS = """
import sys, mlxinfer, mlx.core as mx, numpy as np
model, tokenizer = mlxinfer.load(None, compute_dtype="bfloat16")
ids = mx.array([tokenizer.encode(sys.argv[1])])
np.save(sys.argv[2], np.array(model(ids).astype(mx.float32)))
"""


@pytest.mark.slow
def test_forward_is_deterministic(embedded, tmp_path):
    """The lesson: one prompt, one machine, the pass gives the same numbers every time. Every time means
    another run of the program too: a second process, which loads the weights again (a weight left at
    its random initialisation, or a reduction whose order depends on threads, would differ there), gives
    every score bit for bit. (The weights as stored, MLX's own kernels. The float32 path's MKL sgemm is
    not held to this across processes: its summation order may follow the buffers' alignment.)"""
    import subprocess
    import sys

    from conftest import ROOT

    model, tokenizer = embedded
    prompt = "Name one herb to add to tomato soup."
    ids = mx.array([tokenizer.encode(prompt)])
    here = np.array(model(ids).astype(mx.float32))
    done = subprocess.run(
        [sys.executable, "-c", _ANOTHER_PASS, prompt, str(tmp_path / "there.npy")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    there = np.load(tmp_path / "there.npy")
    assert there.shape == here.shape == (1, ids.shape[1], model.config.vocab_size)
    assert np.array_equal(here, there), float(np.abs(here - there).max())
