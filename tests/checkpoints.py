"""Tiny random checkpoints in the Hugging Face layout, written by the tests themselves.

Each has config.json, model.safetensors (random bf16 weights), a byte-level BPE
tokenizer trained on a few sentences, a chat template and generation_config.json.
Quantized variants come from mlx-lm's own `convert`, as mlx-community makes them.
"""

from __future__ import annotations

import shutil

import json
from pathlib import Path

import mlx.core as mx
import numpy as np

CORPUS = [
    "Name one herb to add to tomato soup. Answer with one word.",
    "Name one fruit. Answer with one word.",
    "The cat sat on the mat. Thyme, basil, dill, oregano, rosemary.",
    'Apple, mango, banana, cherry, grape 0123456789 {}[]":,',
] * 4
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

BASE = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 384,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 512,
    "torch_dtype": "bfloat16",
}
ARCHS = {
    "llama": {
        "model_type": "llama",
        "tie_word_embeddings": False,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    "qwen3": {"model_type": "qwen3", "head_dim": 48, "tie_word_embeddings": True, "rope_theta": 1000000.0},
    "qwen2": {"model_type": "qwen2", "tie_word_embeddings": True},
}


# Hugging Face module -> GGUF tensor name part in a block (llama.cpp's convert_hf_to_gguf.py), for the
# tests that write GGUF twins of these checkpoints; written out here, not taken from mlxinfer's loader
GGUF_PARTS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
}
GGUF_TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def write_tokenizer(out: Path, vocab_size: int = 300) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "chat_template": CHAT_TEMPLATE,
                "model_max_length": 512,
            }
        )
    )


def write_gguf_metadata(writer, hf_dir: Path) -> None:
    """A GGUF twin's hyperparameters and tokenizer (gpt2 BPE, the twin's own pre-tokenizer), from the
    checkpoint's config.json and tokenizer files, as llama.cpp's converter writes them."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    tokens = [t for t, _ in sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])]
    specials = {t["content"] for t in tok["added_tokens"] if t["special"]}
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    writer.add_rope_freq_base(cfg["rope_theta"])
    writer.add_vocab_size(cfg["vocab_size"])  # the embedding rows; the tokenizer may hold fewer tokens
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])
    writer.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_chat_template(json.loads((hf_dir / "tokenizer_config.json").read_text())["chat_template"])


def hf_weight_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    D, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    E = cfg.get("head_dim") or D // H
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (V, D)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.input_layernorm.weight": (D,),
            f"{p}.post_attention_layernorm.weight": (D,),
            f"{p}.self_attn.q_proj.weight": (H * E, D),
            f"{p}.self_attn.k_proj.weight": (K * E, D),
            f"{p}.self_attn.v_proj.weight": (K * E, D),
            f"{p}.self_attn.o_proj.weight": (D, H * E),
            f"{p}.mlp.gate_proj.weight": (F, D),
            f"{p}.mlp.up_proj.weight": (F, D),
            f"{p}.mlp.down_proj.weight": (D, F),
        }
        if cfg["model_type"] == "qwen3":
            shapes |= {f"{p}.self_attn.q_norm.weight": (E,), f"{p}.self_attn.k_norm.weight": (E,)}
        if cfg["model_type"] == "qwen2" or cfg.get("attention_bias"):
            shapes |= {f"{p}.self_attn.{x}_proj.bias": (n * E,) for x, n in (("q", H), ("k", K), ("v", K))}
        if cfg.get("attention_bias"):  # Llama's: o_proj too
            shapes[f"{p}.self_attn.o_proj.bias"] = (D,)
        if cfg.get("mlp_bias"):
            shapes |= {f"{p}.mlp.{x}_proj.bias": (n,) for x, n in (("gate", F), ("up", F), ("down", D))}
    return shapes


def random_weights(cfg: dict, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in hf_weight_shapes(cfg).items():
        if name.endswith("norm.weight"):
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
    return out


def write_checkpoint(out: Path, arch: str, seed: int = 0, dtype=mx.bfloat16, **overrides) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    cfg = {**BASE, **ARCHS[arch], **overrides}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(
        json.dumps({"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95, "eos_token_id": 2})
    )
    weights = {k: mx.array(v).astype(dtype) for k, v in random_weights(cfg, seed).items()}
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    write_tokenizer(out)
    return out


def corrupt_copy(src: Path, out: Path, tensor: str = "model.layers.1.mlp.up_proj.weight") -> Path:
    """A copy of the checkpoint at src whose `tensor` is all inf (a corrupt download): it loads, and every
    forward pass from that layer on is NaN."""
    shutil.copytree(src, out)
    weights = mx.load(str(out / "model.safetensors"))
    weights[tensor] = mx.full(weights[tensor].shape, float("inf"), dtype=weights[tensor].dtype)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    return out


def quantized_copy(src: Path, out: Path, bits: int, group_size: int, dtype: str | None = None) -> Path:
    """mlx-lm's own conversion, exactly what mlx-community publishes (dtype: of scales and floats)."""
    import contextlib
    import io

    from mlx_lm.convert import convert

    with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
        convert(str(src), str(out), quantize=True, q_bits=bits, q_group_size=group_size, dtype=dtype)
    return out


# ---- architectures model.py does not define: written by mlx-lm's own classes -------------------------------

# tiny configs on BASE; qwen3_moe is ours, written here too so that mlx-lm's class makes the file
MLX_LM_ARCHS = {
    "gemma3_text": {
        "model_type": "gemma3_text",
        "head_dim": 32,
        "query_pre_attn_scalar": 32,
        "sliding_window": 8,  # short, so that prompts run past it and the rotating cache rotates
        "sliding_window_pattern": 2,  # layer 0 slides, layer 1 sees everything
        "rope_local_base_freq": 10000.0,
        "rope_theta": 1000000.0,
    },
    "mistral": {"model_type": "mistral", "tie_word_embeddings": False, "sliding_window": None},
    "phi3": {"model_type": "phi3", "tie_word_embeddings": False},
    "mixtral": {
        "model_type": "mixtral",
        "intermediate_size": 128,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
    },
    "olmo2": {"model_type": "olmo2", "tie_word_embeddings": False},
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        "head_dim": 32,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
        "rope_theta": 1000000.0,
    },
}


def mlx_lm_config(arch: str, **overrides) -> dict:
    return {**BASE, **MLX_LM_ARCHS[arch], **overrides}


def mlx_lm_model(cfg: dict):
    """mlx-lm's own class for this config, as mlx_lm.load picks it (mistral runs on its llama)."""
    import importlib

    from mlx_lm.utils import MODEL_REMAPPING

    module = importlib.import_module(f"mlx_lm.models.{MODEL_REMAPPING.get(cfg['model_type'], cfg['model_type'])}")
    return module.Model(module.ModelArgs.from_dict(cfg))


def write_mlx_lm_checkpoint(out: Path, arch: str, seed: int = 0, **overrides) -> Path:
    """A tiny random checkpoint for mlx-lm's class, in the mlx-community layout: config.json,
    model.safetensors (bf16, mlx-lm's tensor names), tokenizer files and generation_config.json."""
    from mlx.utils import tree_flatten

    out.mkdir(parents=True, exist_ok=True)
    cfg = mlx_lm_config(arch, **overrides)
    model = mlx_lm_model(cfg)
    rng = np.random.default_rng(seed)
    one = 0.0 if arch.startswith("gemma") else 1.0  # Gemma's RMSNorm scales by 1 + weight
    weights = {}
    for name, p in tree_flatten(model.parameters()):
        if arch == "gemma3_text" and name.startswith("lm_head."):
            continue  # Gemma 3 stores no output table: the embedding table serves both ends
        if "norm" in name.rsplit(".", 2)[-2]:
            value = one + 0.1 * rng.standard_normal(p.shape)
        else:
            value = rng.standard_normal(p.shape) / np.sqrt(p.shape[-1])
        weights[name] = mx.array(value.astype(np.float32)).astype(mx.bfloat16)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"temperature": 0.7, "top_p": 0.9, "eos_token_id": 2}))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    write_tokenizer(out)
    return out


# ---- a model small enough to enumerate: a word-level vocabulary of a dozen tokens ---------------------------
WORDS = ["basil", "thyme", "dill", "sage", "mint", "soup", "and", ".", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def write_word_checkpoint(out: Path, seed: int = 0, scale: float = 3.0) -> Path:
    """A tiny llama over WORDS (eos <|im_end|>), whose every continuation a test can enumerate by hand.
    `scale` widens the output table's scores so that temperature and cuts have something to do."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    out.mkdir(parents=True, exist_ok=True)
    cfg = {**BASE, **ARCHS["llama"], "vocab_size": len(WORDS), "num_hidden_layers": 1, "hidden_size": 64,
           "intermediate_size": 128}  # fmt: skip
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    weights = random_weights(cfg, seed)
    weights["lm_head.weight"] *= scale
    mx.save_safetensors(str(out / "model.safetensors"), {k: mx.array(v) for k, v in weights.items()})
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(WORDS[-3:])
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    return out


# ---- GGUF files, written as llama.cpp's converter and quantizer lay them out -------------------------------


def gguf_name(hf_name: str) -> str:
    module, _, part = hf_name.rpartition(".")
    if module in GGUF_TOP:
        return f"{GGUF_TOP[module]}.{part}"
    _, _, layer, inside = module.split(".", 3)
    return f"blk.{layer}.{GGUF_PARTS[inside]}.{part}"


def write_gguf(hf_dir: Path, out: Path, kind=lambda name, shape: "F32", file_type: int | None = None) -> dict:
    """The checkpoint in `hf_dir` (llama, qwen2 or qwen3) as a GGUF file written by the gguf package:
    llama's q/k rows permuted as convert_hf_to_gguf.py permutes them, the tokenizer and chat template in
    metadata, each tensor stored as kind(gguf name, shape) gives (vectors stay F32; quantized types through
    tests/ggml_blocks.py). Returns {gguf name: the float32 values written, before quantization}."""
    import gguf
    import ggml_blocks

    cfg = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    tokens = [t for t, _ in sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])]
    specials = {t["content"] for t in tok["added_tokens"] if t["special"]}
    weights = {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(hf_dir / "model.safetensors")).items()}
    arch = cfg["model_type"]
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_vocab_size(cfg["vocab_size"])
    if cfg.get("head_dim"):
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    if file_type is not None:
        w.add_file_type(file_type)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in specials else 1 for t in tokens])
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]])
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_chat_template(json.loads((hf_dir / "tokenizer_config.json").read_text())["chat_template"])

    def permute(v, heads):  # convert_hf_to_gguf.py's LlamaModel.permute
        return v.reshape(heads, 2, v.shape[0] // heads // 2, *v.shape[1:]).swapaxes(1, 2).reshape(v.shape)

    written = {}
    scaling = cfg.get("rope_scaling") or {}
    if scaling.get("rope_type") in ("linear", "yarn"):  # as metadata
        w.add_rope_scaling_type(gguf.RopeScalingType(scaling["rope_type"]))
        w.add_rope_scaling_factor(scaling["factor"])
    if scaling.get("rope_type") == "llama3":  # convert_hf_to_gguf.py's LlamaModel: one factor per rotary pair
        factors = _llama3_rope_factors(cfg)
        w.add_tensor("rope_freqs.weight", factors)
        written["rope_freqs.weight"] = factors
    for name, value in weights.items():
        if arch == "llama" and name.endswith("self_attn.q_proj.weight"):
            value = permute(value, cfg["num_attention_heads"])
        elif arch == "llama" and name.endswith("self_attn.k_proj.weight"):
            value = permute(value, cfg["num_key_value_heads"])
        gname = gguf_name(name)
        written[gname] = value
        t = kind(gname, value.shape) if value.ndim == 2 else "F32"
        if t in ("F32", "F16"):
            w.add_tensor(gname, value.astype(np.float32 if t == "F32" else np.float16))
        else:
            w.add_tensor(gname, ggml_blocks.quantize(value, t), raw_dtype=gguf.GGMLQuantizationType[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


def _llama3_rope_factors(cfg: dict) -> np.ndarray:
    """What llama.cpp's converter stores as rope_freqs.weight for Llama 3.1's scaling: 1 for short
    wavelengths, `factor` for long ones, the inverse of the smooth ramp between."""
    import math

    s, dim = cfg["rope_scaling"], cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    factor, low, high = s["factor"], s.get("low_freq_factor", 1.0), s.get("high_freq_factor", 4.0)
    old = s.get("original_max_position_embeddings", 8192)
    out = []
    for freq in 1.0 / cfg["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim):
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)
