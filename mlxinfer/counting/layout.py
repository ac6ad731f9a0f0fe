"""The tensors a config implies, named as in the checkpoint (Hugging Face and mlx-lm agree), each
with its place in the lesson's table. Which projections carry biases and whether heads have
q/k norms come from ModelConfig, which reads them from the one description per architecture
(formats/config.py) that the model definition reads too."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..formats.config import ModelConfig


@dataclass(frozen=True)
class Weight:
    """One tensor the config implies, named as in the checkpoint (HF and mlx-lm agree)."""

    name: str  # e.g. "model.layers.0.mlp.up_proj.weight"
    shape: tuple[int, ...]  # (out, in) for a matrix, (n,) for a norm or a bias
    part: str  # embedding | attention | mlp | norms | final_norm | output
    label: str  # the row of the lesson's table it belongs to
    formula: str

    @property
    def params(self) -> int:
        return math.prod(self.shape)


def layer_weights(cfg: ModelConfig, i: int) -> list[Weight]:
    """Every tensor of layer i. D hidden, H query heads, K key/value heads, hd head dim, F MLP width."""
    D, H, K, hd, F = (
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.intermediate_size,
    )
    a, m, p = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp.", f"model.layers.{i}."
    w = [
        Weight(a + "q_proj.weight", (H * hd, D), "attention", "query", f"{D:,} x ({H} x {hd})"),
        Weight(a + "k_proj.weight", (K * hd, D), "attention", "key", f"{D:,} x ({K} x {hd})"),
        Weight(a + "v_proj.weight", (K * hd, D), "attention", "value", f"{D:,} x ({K} x {hd})"),
        Weight(a + "o_proj.weight", (D, H * hd), "attention", "output", f"({H} x {hd}) x {D:,}"),
    ]
    biased = [n for n, on in (("q", cfg.qkv_bias), ("k", cfg.qkv_bias), ("v", cfg.qkv_bias), ("o", cfg.o_bias)) if on]
    if biased:  # Qwen2: q, k, v; Llama with attention_bias: q, k, v and o
        sizes = {"q": H * hd, "k": K * hd, "v": K * hd, "o": D}
        f = " + ".join(f"{sizes[n]:,}" for n in biased)
        w += [Weight(a + f"{n}_proj.bias", (sizes[n],), "attention", "biases", f) for n in biased]
    if cfg.qk_norm:  # Qwen3: an RMSNorm over each query and key head
        w += [
            Weight(a + f"{n}_norm.weight", (hd,), "attention", "query and key norms", f"2 x {hd}") for n in ("q", "k")
        ]
    w += [
        Weight(m + "gate_proj.weight", (F, D), "mlp", "gate", f"{D:,} x {F:,}"),
        Weight(m + "up_proj.weight", (F, D), "mlp", "up", f"{D:,} x {F:,}"),
        Weight(m + "down_proj.weight", (D, F), "mlp", "down", f"{F:,} x {D:,}"),
    ]
    if cfg.mlp_bias:
        w += [
            Weight(m + f"{n}_proj.bias", (s,), "mlp", "biases", f"{F:,} + {F:,} + {D:,}")
            for n, s in (("gate", F), ("up", F), ("down", D))
        ]
    return w + [
        Weight(p + n, (D,), "norms", "two norms", f"2 x {D:,}")
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight")
    ]


def model_weights(cfg: ModelConfig) -> list[Weight]:
    V, D = cfg.vocab_size, cfg.hidden_size
    w = [Weight("model.embed_tokens.weight", (V, D), "embedding", "embedding table", f"{V:,} x {D:,}")]
    for i in range(cfg.num_hidden_layers):
        w += layer_weights(cfg, i)
    w.append(Weight("model.norm.weight", (D,), "final_norm", "final norm", ""))
    if not cfg.tie_word_embeddings:
        w.append(Weight("lm_head.weight", (V, D), "output", "output table", f"{D:,} x {V:,}"))
    return w
