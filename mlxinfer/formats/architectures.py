"""One description per architecture: what it adds to or changes in the plain Llama block, and its
names in the other layouts (Hugging Face's class, llama.cpp's GGUF architecture, mlx-lm's module).

Every per-architecture fact lives here and nowhere else: the model definition (model/model.py, for
the architectures marked `ours`), `count` (counting/layout.py), the GGUF loader (formats/gguf.py's
architecture names, model/weights.py's q/k rows), the exporter (quant/export.py's `architectures`)
and the mlx-lm peer (model/peers.py) all read them. What is the same for every architecture stays
with its reader: llama.cpp's tensor names (gguf.py), ggml's types (ggml_types.py), the GGUF
metadata keys under the architecture's name (gguf.py), the tokenizer, which a GGUF file names for
itself (`tokenizer.ggml.model`/`.pre`, tokenizer_load.py) whatever its architecture.

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
    head_dim: int | None = None  # config.json silent: Hugging Face's default for the class (else hidden / heads)
    tied: bool = False  # tie_word_embeddings when config.json does not say
    hf_class: str = ""  # Hugging Face's class, config.json's `architectures` (the exporter writes it)
    mlx_lm: str = ""  # mlx-lm's module for it (mlx_lm.models.<name>): the peer of ours
    gguf: str = ""  # llama.cpp's `general.architecture` for it; "": GGUF files of it do not load
    gguf_permuted_qk: bool = False  # llama.cpp's converter stored q/k rows permuted (interleaved RoPE)

    @property
    def definition(self) -> str:
        return "mlxinfer" if self.ours else "mlx-lm"


ARCHITECTURES = {
    "llama": Architecture(
        qkv_bias=None,
        o_bias=None,
        mlp_bias=None,
        hf_class="LlamaForCausalLM",
        mlx_lm="llama",
        gguf="llama",
        gguf_permuted_qk=True,
    ),
    "qwen2": Architecture(qkv_bias=True, context=32768, hf_class="Qwen2ForCausalLM", mlx_lm="qwen2", gguf="qwen2"),
    "qwen3": Architecture(
        head_dim=128,  # Qwen3Config's default, not hidden / heads (which is 64 for the 0.6B's shape)
        qkv_bias=None,
        o_bias=None,
        qk_norm=True,
        context=32768,
        hf_class="Qwen3ForCausalLM",
        mlx_lm="qwen3",
        gguf="qwen3",
    ),
    # Qwen3's block with a mixture of experts for the MLP (mlx-lm's class has no attention biases)
    "qwen3_moe": Architecture(
        qk_norm=True, context=32768, moe="mlp", hf_class="Qwen3MoeForCausalLM", mlx_lm="qwen3_moe"
    ),
    # the rest run on mlx-lm's classes; described here so that `count` has a formula for them
    "mistral": Architecture(
        qkv_bias=None,
        o_bias=None,
        mlp_bias=None,
        context=32768,
        ours=False,
        hf_class="MistralForCausalLM",
        mlx_lm="llama",  # mlx-lm runs Mistral on its Llama class
    ),
    "mixtral": Architecture(
        context=32768,
        ours=False,
        moe="block_sparse_moe",
        experts="num_local_experts",
        expert_width="intermediate_size",
        config_head_dim=False,
        hf_class="MixtralForCausalLM",
        mlx_lm="mixtral",
    ),
    "gemma3_text": Architecture(
        qk_norm=True,
        context=32768,
        ours=False,
        norms=PAIR + ("pre_feedforward_layernorm", "post_feedforward_layernorm"),
        tied=True,
        hf_class="Gemma3ForCausalLM",
        mlx_lm="gemma3_text",
    ),
    "phi3": Architecture(
        context=4096, ours=False, fused=True, config_head_dim=False, hf_class="Phi3ForCausalLM", mlx_lm="phi3"
    ),
}
OURS = tuple(k for k, a in ARCHITECTURES.items() if a.ours)
# llama.cpp's architecture name -> our model type, for the architectures a GGUF file of loads
GGUF = {a.gguf: k for k, a in ARCHITECTURES.items() if a.gguf}
