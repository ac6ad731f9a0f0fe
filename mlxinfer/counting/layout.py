"""The tensors a config implies, named as mlx-lm's classes name them (Hugging Face's names, with a
mixture's experts stacked into one `switch_mlp` tensor per projection, as mlx-community stores
them), each with its place in the lesson's table. Which projections carry biases, which norms a
block has, whether q/k/v are one matrix and where the experts sit come from the one Architecture
per model type (formats/architectures.py) that the model definition reads too."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..formats.config import ModelConfig

NUMBERS = {1: "one", 2: "two", 3: "three", 4: "four"}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Weight:
    """One tensor the config implies, named as in the checkpoint (HF and mlx-lm agree)."""

    name: str  # e.g. "model.layers.0.mlp.up_proj.weight"
    shape: tuple[int, ...]  # (out, in) for a matrix, (experts, out, in) for stacked experts, (n,) for a norm
    part: str  # embedding | attention | mlp | norms | final_norm | output
    label: str  # the row of the lesson's table it belongs to
    formula: str
    experts: int = 0  # > 0: this tensor stacks that many experts, of which a token uses k

    @property
    def params(self) -> int:
        return math.prod(self.shape)

    @property
    def layer(self) -> int | None:
        m = _LAYER.match(self.name)
        return int(m.group(1)) if m else None

    def active(self, k: int) -> int:
        """Parameters one token uses: k of the stacked experts, or all of a plain tensor."""
        return self.params // self.experts * k if self.experts else self.params


def layer_weights(cfg: ModelConfig, i: int) -> list[Weight]:
    """Every tensor of layer i. D hidden, H query heads, K key/value heads, hd head dim, F MLP width."""
    arch = cfg.architecture
    D, H, K, hd = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    a, p = f"model.layers.{i}.self_attn.", f"model.layers.{i}."
    if arch.fused:  # Phi-3: one matrix computes q, k and v together
        qkv = H * hd + 2 * K * hd
        w = [
            Weight(a + "qkv_proj.weight", (qkv, D), "attention", "query, key, value", f"{D:,} x ({H} + 2 x {K}) x {hd}")
        ]
    else:
        w = [
            Weight(a + "q_proj.weight", (H * hd, D), "attention", "query", f"{D:,} x ({H} x {hd})"),
            Weight(a + "k_proj.weight", (K * hd, D), "attention", "key", f"{D:,} x ({K} x {hd})"),
            Weight(a + "v_proj.weight", (K * hd, D), "attention", "value", f"{D:,} x ({K} x {hd})"),
        ]
    w.append(Weight(a + "o_proj.weight", (D, H * hd), "attention", "output", f"({H} x {hd}) x {D:,}"))
    biased = [n for n, on in (("q", cfg.qkv_bias), ("k", cfg.qkv_bias), ("v", cfg.qkv_bias), ("o", cfg.o_bias)) if on]
    if biased:  # Qwen2: q, k, v; Llama with attention_bias: q, k, v and o
        sizes = {"q": H * hd, "k": K * hd, "v": K * hd, "o": D}
        f = " + ".join(f"{sizes[n]:,}" for n in biased)
        w += [Weight(a + f"{n}_proj.bias", (sizes[n],), "attention", "biases", f) for n in biased]
    if cfg.qk_norm:  # Qwen3, Gemma 3: an RMSNorm over each query and key head
        w += [
            Weight(a + f"{n}_norm.weight", (hd,), "attention", "query and key norms", f"2 x {hd}") for n in ("q", "k")
        ]
    w += experts(cfg, i) if i in cfg.moe_layers else mlp(cfg, i)
    label = f"{NUMBERS.get(len(arch.norms), len(arch.norms))} norms"
    return w + [Weight(p + f"{n}.weight", (D,), "norms", label, f"{len(arch.norms)} x {D:,}") for n in arch.norms]


def mlp(cfg: ModelConfig, i: int) -> list[Weight]:
    D, F, m = cfg.hidden_size, cfg.intermediate_size, f"model.layers.{i}.mlp."
    if cfg.architecture.fused:  # Phi-3: gate and up in one matrix
        return [
            Weight(m + "gate_up_proj.weight", (2 * F, D), "mlp", "gate and up", f"{D:,} x (2 x {F:,})"),
            Weight(m + "down_proj.weight", (D, F), "mlp", "down", f"{F:,} x {D:,}"),
        ]
    w = [
        Weight(m + "gate_proj.weight", (F, D), "mlp", "gate", f"{D:,} x {F:,}"),
        Weight(m + "up_proj.weight", (F, D), "mlp", "up", f"{D:,} x {F:,}"),
        Weight(m + "down_proj.weight", (D, F), "mlp", "down", f"{F:,} x {D:,}"),
    ]
    if cfg.mlp_bias:
        w += [
            Weight(m + f"{n}_proj.bias", (s,), "mlp", "biases", f"{F:,} + {F:,} + {D:,}")
            for n, s in (("gate", F), ("up", F), ("down", D))
        ]
    return w


def experts(cfg: ModelConfig, i: int) -> list[Weight]:
    """A mixture of experts: the router (one score per expert) and n expert MLPs, stacked."""
    D, n, F = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
    m = f"model.layers.{i}.{cfg.architecture.moe}."
    return [
        Weight(m + "gate.weight", (n, D), "mlp", "router", f"{D:,} x {n} experts"),
        Weight(m + "switch_mlp.gate_proj.weight", (n, F, D), "mlp", "expert gates", f"{n} x {D:,} x {F:,}", n),
        Weight(m + "switch_mlp.up_proj.weight", (n, F, D), "mlp", "expert ups", f"{n} x {D:,} x {F:,}", n),
        Weight(m + "switch_mlp.down_proj.weight", (n, D, F), "mlp", "expert downs", f"{n} x {F:,} x {D:,}", n),
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


# Hugging Face stores each expert apart (Mixtral as w1/w2/w3); mlx-lm stacks them into switch_mlp
_EXPERT = re.compile(r"^(.*)\.experts\.\d+\.(\w+)\.(weight|scales|biases)$")
_MIXTRAL = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}


def stacked_name(name: str) -> str:
    """The stacked tensor a per-expert tensor belongs to; any other name as it is."""
    m = _EXPERT.match(name)
    return f"{m[1]}.switch_mlp.{_MIXTRAL.get(m[2], m[2])}.{m[3]}" if m else name
