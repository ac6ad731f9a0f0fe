"""One description per architecture: what it adds to or changes in the plain Llama block.

The model definition (model/model.py, for the architectures marked `ours`) and `count`
(counting/layout.py, for every architecture here) both read these, so they cannot drift apart.
An architecture not listed here still loads when mlx-lm has a class for it; `count` then counts
from the file headers instead of a formula. No mlx import here.
"""

from __future__ import annotations

from dataclasses import dataclass

PAIR = ("input_layernorm", "post_attention_layernorm")


@dataclass(frozen=True)
class Architecture:
    """None for a bias: as config.json's `attention_bias` (`mlp_bias`) says, Hugging Face's rule for that family."""

    qkv_bias: bool | None = False  # q/k/v projections carry biases
    o_bias: bool | None = False  # the attention's output projection carries a bias
    mlp_bias: bool | None = False  # gate/up/down carry biases
    qk_norm: bool = False  # an RMSNorm over each query and key head before RoPE
    context: int = 2048  # max_position_embeddings when config.json does not say
    ours: bool = True  # model.py defines it; False: mlx-lm's own class runs it
    fused: bool = False  # Phi-3: one qkv_proj for q/k/v and one gate_up_proj for gate/up
    norms: tuple[str, ...] = PAIR  # the RMSNorms of each block, by name
    moe: str = ""  # the mixture-of-experts block's module name ("mlp", "block_sparse_moe"); "" for dense
    experts: str = "num_experts"  # config.json's key for the number of experts ...
    expert_width: str = "moe_intermediate_size"  # ... and for each expert's MLP width
    config_head_dim: bool = True  # False: the class takes hidden / heads whatever config.json says
    tied: bool = False  # tie_word_embeddings when config.json does not say

    @property
    def definition(self) -> str:
        return "mlxinfer" if self.ours else "mlx-lm"


ARCHITECTURES = {
    "llama": Architecture(qkv_bias=None, o_bias=None, mlp_bias=None),
    "qwen2": Architecture(qkv_bias=True, context=32768),
    "qwen3": Architecture(qkv_bias=None, o_bias=None, qk_norm=True, context=32768),
    # Qwen3's block with a mixture of experts for the MLP (mlx-lm's class has no attention biases)
    "qwen3_moe": Architecture(qk_norm=True, context=32768, moe="mlp"),
    # the rest run on mlx-lm's classes; described here so that `count` has a formula for them
    "mistral": Architecture(qkv_bias=None, o_bias=None, mlp_bias=None, context=32768, ours=False),  # mlx-lm: llama
    "mixtral": Architecture(
        context=32768,
        ours=False,
        moe="block_sparse_moe",
        experts="num_local_experts",
        expert_width="intermediate_size",
        config_head_dim=False,
    ),
    "gemma3_text": Architecture(
        qk_norm=True,
        context=32768,
        ours=False,
        norms=PAIR + ("pre_feedforward_layernorm", "post_feedforward_layernorm"),
        tied=True,
    ),
    "phi3": Architecture(context=4096, ours=False, fused=True, config_head_dim=False),
}
OURS = tuple(k for k, a in ARCHITECTURES.items() if a.ours)
