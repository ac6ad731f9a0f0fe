"""How a checkpoint's matrices are quantized, read from config.json (MLX) or a GGUF header: per module
bits, group size and mode, and the bytes that costs."""

from __future__ import annotations

from ..formats import ggml_types, gguf
from ..formats.config import KNOWN_DTYPES, ModelConfig
from .layout import Weight


def quant_setting(q: dict, module: str, in_dim: int) -> tuple[int, int, str] | None:
    """(bits, group_size, mode) for one Linear/Embedding, or None: mlx-lm leaves it in float."""
    over = q.get(module, True)
    if over is False:
        return None
    s = over if isinstance(over, dict) else q
    bits, group = int(s.get("bits", q["bits"])), int(s.get("group_size", q["group_size"]))
    return None if in_dim % group else (bits, group, s.get("mode", q.get("mode", "affine")))


def mlx_quant(cfg: ModelConfig, weights: list[Weight], stored: set[str] | None = None) -> dict | None:
    """MLX quantization: packed bits plus, per group, a scale and a bias (affine, 16-bit each) or one
    8-bit scale (mxfp4/mxfp8/nvfp4). Matrices only (Linear, Embedding, stacked experts); norms and
    biases stay float. stored: the files' tensor names, where there are files: a matrix stored without
    its scales is float, as mlx-lm's loader reads it (a quantization predicate that skipped a layer writes
    no entry in the config)."""
    q = cfg.quantization
    if not q:
        return None
    fb = KNOWN_DTYPES[cfg.dtype]
    total_bytes = emb_bytes = expert_bytes = qparams = qbits = 0
    settings: dict[str, int] = {}
    for w in weights:
        s = quant_setting(q, w.name.removesuffix(".weight"), w.shape[-1]) if len(w.shape) >= 2 else None
        if s is not None and stored is not None and w.name in stored and f"{w.name[:-7]}.scales" not in stored:
            s = None
        if s is None:
            nbytes = w.params * fb
        else:
            bits, group, mode = s
            per_group = 2 * fb if mode == "affine" else 1  # scale + bias, or one 8-bit scale
            nbytes = w.params * bits // 8 + w.params // group * per_group
            qparams += w.params
            qbits += 8 * nbytes
            key = f"{bits}-bit, group {group}" + ("" if mode == "affine" else f", {mode}")
            settings[key] = settings.get(key, 0) + w.params
        total_bytes += nbytes
        emb_bytes += nbytes if w.part == "embedding" else 0
        expert_bytes += nbytes if w.experts else 0
    total = sum(w.params for w in weights)
    return {
        "kind": "mlx",
        "bits": q["bits"],
        "group_size": q["group_size"],
        "mode": q.get("mode", "affine"),
        "overrides": sum(1 for v in q.values() if isinstance(v, (dict, bool))),
        "settings": settings,
        "quantized_parameters": qparams,
        "float_parameters": total - qparams,
        "bits_per_quantized_weight": qbits / qparams if qparams else None,
        "bits_per_parameter": 8 * total_bytes / total,
        "bytes": total_bytes,
        "embedding_bytes": emb_bytes,
        "expert_bytes": expert_bytes,
    }


def gguf_quant(h: gguf.GGUFHeader) -> dict:
    """GGUF: the tensor table gives each tensor's ggml type and stored bytes; bits per parameter is what
    llama.cpp prints as BPW (all tensor bytes x 8 / all values), the file type its name for
    general.file_type (guessed as it guesses without the key); `loads_as`: how mlxinfer keeps the type."""
    types: dict[str, dict] = {}
    for t in h.tensors:
        d = types.setdefault(t.type_name, {"tensors": 0, "parameters": 0, "bytes": 0})
        d.update(tensors=d["tensors"] + 1, parameters=d["parameters"] + t.n_elements, bytes=d["bytes"] + t.nbytes)
        d["bits_per_weight"] = 8 * d["bytes"] / d["parameters"]
        d["loads_as"] = ggml_types.loads_as(t.type_name)
    nbytes, params = sum(t.nbytes for t in h.tensors), sum(t.n_elements for t in h.tensors)
    emb = next((t.nbytes for t in h.tensors if t.name == "token_embd.weight"), 0)
    file_type_id, file_type = ggml_types.file_type(h.metadata, {t.name: t.type_name for t in h.tensors})
    return {
        "kind": "gguf",
        "file_type": file_type,
        "file_type_id": file_type_id,
        "types": types,
        "bytes": nbytes,
        "embedding_bytes": emb,
        "bits_per_parameter": 8 * nbytes / params if params else None,
    }


# ---- rates -----------------------------------------------------------------------------------------------
