"""`count`: parameters, bytes and operations per token, worked out from config.json alone,
then checked against what the checkpoint actually stores (safetensors or GGUF headers,
read by `stored`).

Pure Python on purpose: no mlx, mlx-lm, transformers or numpy, so it starts fast and
never loads (or downloads) a weight. huggingface_hub is imported only for a hub repo id.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

from ..errors import MlxinferError, is_whole
from ..formats import gguf, safetensors, sources
from ..formats.config import KNOWN_DTYPES, ModelConfig
from ..views import CountReport
from .headers import expert_layers, header_weights, no_formula
from .layout import NUMBERS, Weight, model_weights, stacked_name
from .stored import stored_gguf, stored_safetensors
from . import split
from .windows import attended, attended_over, attention_windows, crossover
from .quantization import gguf_quant, mlx_quant, quant_setting


MAX_TOKENS_COUNTED = 10**12  # a context or an answer of up to a trillion tokens (no model reads one that long)


def count(
    source: str | Path | None = None,
    context: int | None = None,
    answer_tokens: int | None = None,
    flops: float | str | None = None,
    bandwidth: float | str | None = None,
    ranks: int | None = None,
) -> CountReport:
    """Count a model from its config (local dir, config .json, .gguf, hub repo id, or None: the embedded GGUF).

    ranks: also the memory each of N ranks holds when the model is split across them (weights, and the
    KV cache at `context` tokens or the model's whole context); see counting/split.py."""
    for name, v in (("context", context), ("answer_tokens", answer_tokens)):
        if v is not None and (not is_whole(v) or not 1 <= v <= MAX_TOKENS_COUNTED):
            raise MlxinferError(
                f"{name} must be a whole number of tokens from 1 to {MAX_TOKENS_COUNTED:,}; got {v!r}", name
            )
    if answer_tokens is not None and context is None:
        raise MlxinferError("answer_tokens needs context: the prompt's length in tokens", "answer_tokens", "context")
    flops = None if flops is None else parse_rate(flops, "flops")
    bandwidth = None if bandwidth is None else parse_rate(bandwidth, "bandwidth")

    src, kind, cfg, files, header, notes = _open(source)
    if files and not cfg.tie_word_embeddings_given:
        stored = {stacked_name(t["name"]) for f in files for t in f["tensors"]}
        cfg = replace(cfg, tie_word_embeddings="lm_head.weight" not in stored)
        notes.append(
            "config.json does not say whether the tables are tied; the stored tensors decide: "
            + ("tied" if cfg.tie_word_embeddings else "not tied")
        )
    if cfg.described:
        weights = model_weights(cfg)
    else:
        weights = header_weights(cfg, files)
        cfg = replace(cfg, moe_layers=expert_layers(weights))  # a token runs k of the n experts stored there
        notes.insert(
            0, no_formula(cfg.model_type) + ": counted from the safetensors headers (quantized weights unpacked)"
        )
    if cfg.foreign_quantization:
        notes.append(
            f"quantization_config names {cfg.foreign_quantization!r}, not MLX's layout: the bytes are priced as "
            f"{cfg.dtype}, not as stored (mlxinfer does not load these weights)"
        )
    if cfg.num_experts and not cfg.moe_layers:
        notes.append("no layer has experts (mlp_only_layers, decoder_sparse_step): every MLP is dense")
    r = _parameter_table(src.name, kind, cfg, weights, notes)
    if cfg.moe_layers:
        r.experts = _experts(cfg, weights, r.total)
    if header:
        r.quantization, r.stored = gguf_quant(header), stored_gguf(header, r.total, {w.name: w.shape for w in weights})
        if src.dequantized:  # @float32: every tensor is read as float32
            r.quantization.update(loaded_bytes=4 * r.total, loaded_embedding_bytes=4 * r.embedding)
            for type_name, d in r.quantization["types"].items():
                d["loads_as"] = "as stored" if type_name == "F32" else "as float32 (dequantized)"
            notes.append("@float32: every tensor is read as float32 values (4 bytes a parameter)")
        notes.append(
            f"GGUF: the bytes in {cfg.dtype} are what the model would take unquantized; "
            "the tensor table gives the bytes actually stored"
        )
    else:
        stored = {stacked_name(t["name"]) for f in files for t in f["tensors"]} if files else None
        r.quantization = mlx_quant(cfg, weights, stored)
        if files:
            predicted = (r.quantization or {}).get("bytes", r.bytes)
            r.stored = stored_safetensors(files, cfg, [w.name for w in weights], r.total, predicted)
    _work(r, cfg, weights, context, answer_tokens, flops, bandwidth)
    if ranks is not None:
        r.ranks = _per_rank(cfg, ranks, weights, files, header, context or cfg.max_position_embeddings, r)
    return r


def _per_rank(cfg, ranks, weights, files, header, context, r) -> dict:
    """Each rank's share of the stored tensors (the files' tables when there are files, else the config's
    tensors at the config's quantization) and of the KV cache."""
    if not (cfg.architecture and cfg.architecture.ours) or cfg.num_experts:
        raise MlxinferError(
            f"ranks: the split across ranks is worked out for mlxinfer's dense definitions (llama, qwen2, qwen3), "
            f"not {cfg.model_type}; leave ranks out",
            "ranks",
        )
    plan = split.plan(cfg, ranks, split.column_groups(cfg, files, header))
    if header is not None:
        tensors = [(t.name, t.nbytes) for t in header.tensors]
    elif files:
        tied = cfg.tie_word_embeddings
        tensors = [
            (t["name"], t["bytes"])
            for f in files
            for t in f["tensors"]
            if not (tied and t["name"].startswith("lm_head."))
        ]
    else:
        tensors = [(w.name, _stored_bytes(cfg, w)) for w in weights]
    return split.per_rank(cfg, plan, tensors, r.bytes_per_parameter, context)


def _stored_bytes(cfg: ModelConfig, w: Weight) -> int:
    """One tensor's bytes at the config's dtype and quantization (packed bits, a scale and a bias per group)."""
    fb = KNOWN_DTYPES[cfg.dtype]
    s = quant_setting(cfg.quantization, w.name.removesuffix(".weight"), w.shape[-1]) if cfg.quantization else None
    if s is None or len(w.shape) != 2:
        return w.params * fb
    bits, group, mode = s
    return w.params * bits // 8 + w.params // group * (2 * fb if mode == "affine" else 1)


def _open(source) -> tuple[sources.ModelSource, str, ModelConfig, list[dict] | None, gguf.GGUFHeader | None, list[str]]:
    """-> (the source resolved, kind: config | gguf | hub, config, safetensors tables or None, GGUF header or None,
    notes)."""
    src = sources.resolve(source, weights=False)
    if src.kind == "gguf":
        h = gguf.read_header(src.path, tokenizer=False)
        return src, "gguf", gguf.config_from_header(h), None, h, []
    if src.kind == "hub":
        cfg = ModelConfig.from_file(sources.hub_config(src.name), undescribed=True)  # first: a hub out of reach says so
        files, notes = sources.hub_headers(src.name)
        return src, "hub", cfg, files, None, notes
    if src.kind == "config":  # a config file alone: nothing stored to compare with
        return src, "config", ModelConfig.from_file(src.path, undescribed=True), None, None, []
    cfg = ModelConfig.from_file(src.path, undescribed=True)
    return src, "config", cfg, safetensors.local_files(src.path), None, []


def _parameter_table(name: str, kind: str, cfg: ModelConfig, weights: list[Weight], notes: list[str]) -> CountReport:
    """The lesson's table. One layer is shown tensor by tensor: the first with experts, if any."""
    by_part: dict[str, int] = {}
    for w in weights:
        by_part[w.part] = by_part.get(w.part, 0) + w.params
    L, D, V = cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size
    shown = cfg.moe_layers[0] if cfg.moe_layers else 0
    layer0 = [w for w in weights if w.layer == shown]
    att, mlp, norms = (sum(w.params for w in layer0 if w.part == p) for p in ("attention", "mlp", "norms"))
    layer, total = att + mlp + norms, sum(w.params for w in weights)
    layers = sum(by_part.get(p, 0) for p in ("attention", "mlp", "norms"))
    emb, out = by_part.get("embedding", 0), by_part.get("output", 0)
    layer_norms = [w for w in layer0 if w.part == "norms"]
    if len({w.label for w in layer_norms}) == 1:  # "two norms", "2 x 2,048"
        norm_label, norm_formula = layer_norms[0].label, layer_norms[0].formula
    else:  # from the headers: one tensor each
        norm_label = f"{NUMBERS.get(len(layer_norms), len(layer_norms))} norms"
        norm_formula = " + ".join(w.formula for w in layer_norms)
    alike = layers == L * layer
    rows = [_row("embedding table", f"{V:,} x {D:,}", emb), _row(f"per layer{'' if alike else f' ({shown})'}:")]
    rows += [_row("attention", indent=1)]
    rows += _grouped([w for w in layer0 if w.part == "attention"])
    rows += [
        _row("attention subtotal", "", att, 2),
        _row("MLP" + (" (mixture of experts)" if shown in cfg.moe_layers else ""), indent=1),
    ]
    rows += _grouped([w for w in layer0 if w.part == "mlp"])
    rows += [
        _row("MLP subtotal", "", mlp, 2),
        _row(norm_label, norm_formula, norms, 1),
        _row("layer total", "", layer, 1),
        _row(
            f"{L} layers",
            f"{L} x {layer:,}" if alike else f"{len(cfg.moe_layers)} with experts, the rest dense",
            layers,
        ),
        _row("final norm", "", by_part.get("final_norm", 0)),
        *([_row("other tensors", "outside the layers", by_part["other"])] if "other" in by_part else []),
        _row("output table", "the embedding table, used again" if cfg.tie_word_embeddings else f"{D:,} x {V:,}", out),
        _row("TOTAL", "", total),
    ]
    nbytes = KNOWN_DTYPES[cfg.dtype]
    shares = {
        "mlp_of_layer": mlp / layer if layer else 0.0,
        "attention_of_layer": att / layer if layer else 0.0,
        "layers_of_model": layers / total,
        "vocab_tables_of_model": (emb + out) / total,
    }
    return CountReport(
        name,
        kind,
        cfg.to_dict(),
        rows,
        emb,
        att,
        mlp,
        norms,
        layer,
        L,
        layers,
        by_part.get("final_norm", 0),
        out,
        total,
        cfg.dtype,
        nbytes,
        total * nbytes,
        shares,
        {},
        notes=notes,
    )


def _experts(cfg: ModelConfig, weights: list[Weight], total: int) -> dict:
    """A mixture of experts: all the parameters are stored, but a token runs only k of n experts."""
    n, k = cfg.num_experts, cfg.num_experts_per_tok
    stacked = sum(w.params for w in weights if w.experts)
    active = sum(w.active(k) for w in weights)
    return {
        "num_experts": n,
        "experts_per_token": k,
        "layers_with_experts": len(cfg.moe_layers),
        "expert_width": cfg.moe_intermediate_size,
        "per_expert": stacked // n // len(cfg.moe_layers),  # one expert's MLP in one layer
        "routers": sum(w.params for w in weights if w.label == "router"),
        "experts_total": stacked,
        "experts_active": stacked // n * k,
        "active": active,
        "inactive": total - active,
        "active_share": active / total,
        "rule": f"active per token: every parameter outside the experts (embedding, attention, norms, routers, "
        f"output table) plus {k} of the {n} experts in each of the {len(cfg.moe_layers)} layers that have them",
    }


def _row(label: str, formula: str = "", params: int | None = None, indent: int = 0) -> dict:
    return {"label": label, "formula": formula, "params": params, "indent": indent}


def _grouped(weights: list[Weight]) -> list[dict]:
    """One row per label, in order: the two Qwen3 head norms or the three biases share a row."""
    rows: dict[str, dict] = {}
    for w in weights:
        rows.setdefault(w.label, _row(w.label, w.formula, 0, 2))["params"] += w.params
    return list(rows.values())


def _work(r: CountReport, cfg: ModelConfig, weights: list[Weight], context, answer_tokens, flops, bandwidth) -> None:
    """Operations per token (2 per parameter used in arithmetic), attention, and time on a machine."""
    V, D, L = cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers
    # the lookup is free; the scores always cost a V x D matmul, on the shared table when tied;
    # with experts, a token runs only the k its router picks in each layer
    active = r.experts["active"] if r.experts else r.total
    used = active - r.embedding + (V * D if cfg.tie_word_embeddings else 0)
    weights_ops = 2 * used
    per_layer = 2 * 2 * cfg.num_attention_heads * cfg.head_dim  # q.k and the value mix, per earlier token
    per_token = L * per_layer
    windows = attention_windows(cfg)
    windowed = [w for w in windows if w is not None]
    if not per_token:
        cross = None
    else:  # (the plain ratio where no layer has a window: the lesson's 28,629 to the digit)
        cross = crossover(weights_ops / per_layer, windows) if windowed else weights_ops / per_token
    r.operations = {
        "parameters_in_arithmetic": used,
        "weights_per_token": weights_ops,
        "attention_per_earlier_token": per_token,
        "attention_per_layer_token": per_layer,
        "windowed_layers": len(windowed),  # layers that attend to the last `sliding_window` tokens only
        "sliding_window": max(windowed) if windowed else None,
        "crossover_context": cross,
        "rule": "2 operations (a multiply and an add) per parameter used in arithmetic: every parameter except "
        "the embedding lookup, plus the output table's matmul (vocab x hidden), which a tied model "
        "runs on the shared table; attention adds layers x 2 x 2 x (heads x head_dim) per earlier token"
        + (
            f" (a layer with a sliding window, {len(windowed)} of {L} here, only for the last {max(windowed):,})"
            if windowed
            else ""
        )
        + ("; of the experts, only the k a token's router picks count" if r.experts else ""),
    }
    held = attended(context or 0, windows)  # layer-token pairs at the context: a window caps its layer's
    if context is not None:
        att = per_layer * held
        r.context = {
            "tokens": context,
            "attended_layer_tokens": held,
            "attention_ops": att,
            "share_of_weights": att / weights_ops,
            "total_ops": weights_ops + att,
            "beyond_max_context": context > cfg.max_position_embeddings,
            "max_context_given": cfg.raw.get("max_position_embeddings") is not None,  # else the architecture's
        }
    if answer_tokens is not None:  # pass k (k = 0 .. M-1) attends to context + k tokens
        M, N = answer_tokens, context
        positions = M * N + M * (M - 1) // 2
        over = attended_over(N, M, windows)
        r.answer = {
            "prompt_tokens": N,
            "answer_tokens": M,
            "passes": M,
            "layer_runs": M * L,
            "weights_ops": M * weights_ops,
            "attended_tokens": positions,
            "average_attended": positions / M,
            "attended_layer_tokens": over,
            "attention_ops": per_layer * over,
            "total_ops": M * weights_ops + per_layer * over,
        }
    q = r.quantization
    model_bytes = q.get("loaded_bytes", q["bytes"]) if q else r.bytes
    emb_bytes = q.get("loaded_embedding_bytes", q["embedding_bytes"]) if q else r.embedding * r.bytes_per_parameter
    read = model_bytes if cfg.tie_word_embeddings else model_bytes - emb_bytes + emb_bytes // V  # one row
    if r.experts:  # one token reads only its k experts' weights in each layer
        n, k = cfg.num_experts, cfg.num_experts_per_tok
        expert_bytes = (q or {}).get("expert_bytes", r.experts["experts_total"] * r.bytes_per_parameter)
        read -= expert_bytes - expert_bytes // n * k
    kv_layer = 2 * cfg.num_key_value_heads * cfg.head_dim * r.bytes_per_parameter  # a layer's, a token of context
    kv = L * kv_layer  # (a windowed layer's stops growing past its window)
    r.operations.update(weight_bytes_read_per_token=read, kv_cache_bytes_per_context_token=kv)
    if context is not None:
        r.context["kv_cache_bytes"] = kv_layer * held
    if flops is None and bandwidth is None:
        return
    ops, nbytes = weights_ops + per_layer * held, read + kv_layer * held
    hw = {
        "flops": flops,
        "bandwidth": bandwidth,
        "context": context or 0,
        "ops": ops,
        "bytes_read": nbytes,
        "kv_cache_bytes": kv_layer * held,
        "ops_per_byte": ops / nbytes,
        "compute_s": flops and ops / flops,
        "memory_s": bandwidth and nbytes / bandwidth,
        "binds": None,
    }
    if flops and bandwidth:
        hw["machine_ops_per_byte"] = flops / bandwidth
        hw["binds"] = "memory" if hw["memory_s"] >= hw["compute_s"] else "compute"
    if r.answer:
        a = r.answer
        hw["answer_compute_s"] = flops and a["total_ops"] / flops
        hw["answer_memory_s"] = bandwidth and (a["passes"] * read + kv_layer * a["attended_layer_tokens"]) / bandwidth
    r.hardware = hw


_PREFIX = {
    "": 1,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_UNITS = {"flops": ("", "flop/s", "flops", "op/s", "ops", "flop"), "bandwidth": ("", "b/s", "bps", "b")}
_RATE = re.compile(r"\s*((?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*(Ki|Mi|Gi|Ti|[kKMGTP])?\s*([A-Za-z/]*)\s*")


def parse_rate(value: float | int | str, kind: str) -> float:
    """'989T', '989 TFLOP/s', '3.35TB/s', '400GB/s', '1.2e12' or a plain number -> per second.
    Prefixes are decimal (T = 10^12), Ki/Mi/Gi/Ti binary; bandwidth is in bytes per second."""
    if kind not in _UNITS:
        raise MlxinferError(f"kind must be one of {', '.join(map(repr, _UNITS))}, got {kind!r:.40}", "kind")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        x = float(value)
    else:
        m = _RATE.fullmatch(str(value))
        if not m or m.group(3).lower() not in _UNITS[kind]:
            example = "989T or 989TFLOP/s" if kind == "flops" else "3.35TB/s or 400GB/s"
            raise MlxinferError(
                f"cannot read {kind} {value!r}; write a number with an optional prefix, like {example}", kind
            )
        x = float(m.group(1)) * _PREFIX[m.group(2) or ""]
        if not (m.group(2) or m.group(3)) and 0 < x < 1e6:  # no machine is this slow: a unit left out
            unit = "989T" if kind == "flops" else f"{m.group(1)}GB/s"
            raise MlxinferError(
                f"{kind} {value!r} has no unit and reads as {m.group(1)} per second; write the unit, like {unit}", kind
            )
    if not (x > 0 and math.isfinite(x)):
        raise MlxinferError(f"{kind} must be a positive number per second; got {value!r}", kind)
    return x
