"""The forward pass: token ids -> embedding lookup -> run_layers -> logits_from_hidden.

One definition serves Llama (Llama 3.x, SmolLM2), Qwen2 (q/k/v biases), Qwen3 (per-head
q/k RMSNorm before RoPE) and Qwen3-MoE (Qwen3 with a mixture of experts for the MLP: moe.py).
Every other architecture runs on mlx-lm's own class (mlx_lm_models.py). Module names are Hugging
Face's (`model.layers.0.self_attn.q_proj`), as in the checkpoints and in mlx-lm, so weights load by
name with no renaming.
Shapes: B batch, L positions, D hidden size, H query heads, K key/value heads, E head size,
V vocabulary.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..cpu import kernels as cpu_kernels
from ..formats.config import ModelConfig
from .cache import KVCache, RaggedCache
from .compute import Kernels
from .info import ModelInfo
from .moe import ROUTER_QUANTIZATION, SparseMoE


class RoPE(nn.Module):
    """Rotary position embedding, non-interleaved (Hugging Face layout), with llama3 scaling."""

    def __init__(self, cfg: ModelConfig, kernels: Kernels | None = None):
        super().__init__()
        self.dims, self.max_positions = cfg.head_dim, cfg.max_position_embeddings
        self.base, self.scale, self._freqs = cfg.rope_theta, 1.0, None
        self.kernels = kernels or Kernels()
        scaling = cfg.rope_scaling or {}
        kind = scaling.get("rope_type") or scaling.get("type") or "default"
        if kind == "linear":
            self.scale = 1.0 / scaling["factor"]
        elif kind == "llama3":
            self._freqs = llama3_frequencies(cfg.head_dim, cfg.rope_theta, scaling)
            self.base = None

    def make_table(self) -> cpu_kernels.RopeTable:
        """The same rotation as mx.fast.rope with these settings, from a cos/sin table."""
        if self._freqs is not None:
            inv_freq = 1.0 / np.array(self._freqs, np.float64)  # mx.fast.rope's freqs are periods / 2pi
        else:
            inv_freq = self.base ** (-np.arange(0, self.dims, 2, dtype=np.float64) / self.dims)
        return cpu_kernels.RopeTable(inv_freq, self.scale, self.max_positions)

    def __call__(self, x: mx.array, offset: int | list[int] = 0) -> mx.array:
        """x (B, heads, L, E) at positions offset .. offset + L - 1; a list: row b at offset[b]."""
        table = self.kernels.rope_table
        if table is not None and isinstance(offset, list):  # row by row: the table takes one offset
            parts = mx.split(x, len(offset), axis=0) if len(offset) > 1 else [x]
            return mx.concatenate([table(part, o) for part, o in zip(parts, offset)])
        if table is not None:
            return table(x, offset)
        # a list of offsets is one op, each row the bits it has alone (tests/test_serve.py compares with sample)
        offset = mx.array(offset) if isinstance(offset, list) else offset
        return mx.fast.rope(
            x, self.dims, traditional=False, base=self.base, scale=self.scale, offset=offset, freqs=self._freqs
        )


def llama3_frequencies(dims: int, base: float, scaling: dict) -> mx.array:
    """Llama 3.1's rope scaling: long wavelengths slowed by `factor`, a smooth ramp in between."""
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_context = scaling.get("original_max_position_embeddings", 8192)
    low_wavelen, high_wavelen = old_context / low, old_context / high
    freqs = base ** (mx.arange(0, dims, 2) / dims)  # these are wavelengths / 2pi, as mx.fast.rope wants
    wavelens = 2 * mx.pi * freqs
    freqs = mx.where(wavelens > low_wavelen, freqs * factor, freqs)
    is_medium = (wavelens > high_wavelen) & (wavelens < low_wavelen)
    smooth = (old_context / wavelens - low) / (high - low)
    return mx.where(is_medium, freqs / ((1 - smooth) / factor + smooth), freqs)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, kernels: Kernels | None = None):
        super().__init__()
        D, H, K, E = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.n_heads, self.n_kv_heads, self.scale = H, K, 1.0 / math.sqrt(E)
        self.q_proj = nn.Linear(D, H * E, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(D, K * E, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(D, K * E, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(H * E, D, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(E, eps=cfg.rms_norm_eps)
            self.k_norm = nn.RMSNorm(E, eps=cfg.rms_norm_eps)
        self.qk_norm = cfg.qk_norm
        self.rope = RoPE(cfg, kernels)

    def __call__(self, x: mx.array, mask, cache: KVCache | RaggedCache | None) -> mx.array:
        """x (B, L, D). cache: one cache for all B rows, or ragged rows' own (L == 1, model/ragged.py)."""
        B, L, _ = x.shape
        q = self.q_proj(x).reshape(B, L, self.n_heads, -1)  # (B, L, H, E)
        k = self.k_proj(x).reshape(B, L, self.n_kv_heads, -1)  # (B, L, K, E)
        v = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))  # (B, heads, L, E)
        ragged = isinstance(cache, RaggedCache)
        caches = cache.rows if ragged else [cache]
        offset = cache.offsets if ragged else cache.offset if cache is not None else 0
        q, k = self.rope(q, offset=offset), self.rope(k, offset=offset)
        # ragged rows: each row's own cache, and attention over its keys only (one split op per tensor)
        qs, ks, vs = (mx.split(t, B, axis=0) if len(caches) > 1 else [t] for t in (q, k, v))
        outs = []
        for c, qr, kr, vr in zip(caches, qs, ks, vs):
            if c is not None:
                kr, vr = c.update_and_fetch(kr, vr)  # (B, K, offset + L, E)
            # each query compares with every earlier key; the mask hides later ones
            outs.append(mx.fast.scaled_dot_product_attention(qr, kr, vr, scale=self.scale, mask=mask))
        out = mx.concatenate(outs) if len(outs) > 1 else outs[0]  # (B, H, L, E)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, kernels: Kernels | None = None):
        super().__init__()
        D, F = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(D, F, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(D, F, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(F, D, bias=cfg.mlp_bias)
        self.kernels = kernels or Kernels()

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(self.kernels.swiglu(self.gate_proj(x), self.up_proj(x)))  # (B, L, F) -> (B, L, D)


class Block(nn.Module):
    """h = h + attn(norm(h)), then h = h + mlp(norm(h)); the norms keep Hugging Face's names.
    In a mixture-of-experts layer the MLP is k of n expert MLPs, picked per token (moe.py)."""

    def __init__(self, cfg: ModelConfig, i: int, kernels: Kernels):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, kernels)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.mlp = SparseMoE(cfg, kernels) if i in cfg.moe_layers else MLP(cfg, kernels)
        self.native = None  # the native kernels' same layer in three larger nodes (native_block.py)

    def __call__(self, h: mx.array, mask, cache: KVCache | RaggedCache | None) -> mx.array:
        native = self.native
        if native is not None and native.takes(h, mask, cache):
            return native(h, cache)
        h = h + self.self_attn(self.input_layernorm(h), mask, cache)  # (B, L, D)
        if native is not None:
            return native.mlp(h)
        return h + self.mlp(self.post_attention_layernorm(h))


class Decoder(nn.Module):
    """The stack Hugging Face calls `model`: the embedding table, the blocks, the final norm."""

    def __init__(self, cfg: ModelConfig, kernels: Kernels):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = [Block(cfg, i, kernels) for i in range(cfg.num_hidden_layers)]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)


class Model(nn.Module):
    def __init__(self, cfg: ModelConfig, info: ModelInfo | None = None):
        super().__init__()
        self.config = cfg
        self.info: ModelInfo = info or ModelInfo.unnamed(f"mlxinfer {cfg.model_type}")
        self.kernels = Kernels()  # MLX's own ops until load chooses (compute.py)
        self.model = Decoder(cfg, self.kernels)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def __call__(self, ids: mx.array, cache: list[KVCache] | None = None) -> mx.array:
        h = self.embed(ids)  # (B, L) -> (B, L, D): a row lookup, no arithmetic
        h = self.run_layers(h, cache)
        return self.logits_from_hidden(h)  # (B, L, V)

    def embed(self, ids: mx.array) -> mx.array:
        return self.model.embed_tokens(ids)

    def run_layers(self, h: mx.array, cache: list | None = None) -> mx.array:
        # L == 1 attends to everything cached; otherwise "causal" lines queries up with the last L keys
        mask = "causal" if h.shape[1] > 1 else None
        for i, layer in enumerate(self.model.layers):
            h = layer(h, mask, cache[i] if cache is not None else None)
        return h

    def logits_from_hidden(self, h: mx.array) -> mx.array:
        h = self.model.norm(h)
        if self.config.tie_word_embeddings:
            return self.model.embed_tokens.as_linear(h)  # the embedding table, used again as the output table
        return self.lm_head(h)

    def shard(self, group=None):
        """Tensor parallelism across `group`'s ranks, in place (model/shard.py): this rank keeps its
        query heads with their KV heads and its MLP columns; mlx-lm's models have the same method."""
        from .shard import shard_layers

        return shard_layers(self, group or mx.distributed.init())

    @property
    def layers(self) -> list[Block]:
        return self.model.layers

    @property
    def quant_predicate(self):
        """What `quantize` does beyond its policy, as mlx-lm's classes say it: routers stay at 8 bits."""
        return lambda path, _module: ROUTER_QUANTIZATION if path.endswith("mlp.gate") else True

    def make_cache(self) -> list[KVCache]:
        return [KVCache() for _ in self.model.layers]
