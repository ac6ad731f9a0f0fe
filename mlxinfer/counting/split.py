"""How a model splits across N ranks by tensor parallelism, worked out from its config alone (no mlx).

Attention splits by groups of query heads that share a key/value head: each rank takes a run of
whole KV heads with their query heads, as evenly as the groups allow (SmolLM2 has 9 query heads in
3 KV groups: 2 ranks take 2 groups and 1), so any number of ranks up to the KV-head count works.
q/k/v split by output rows, o_proj by input columns; the MLP's intermediate columns split the same
way (gate/up by rows, down by columns). Each cut by columns ends in one all_sum, two per layer.
A quantized matrix cut by columns must be cut at a multiple of its group size. The embedding, the
output table and the norms stay whole on every rank, as in mlx-lm.

`plan` is what the loader applies (model/shard.py) and what `count --ranks` prices (`per_rank`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..errors import MlxinferError, check_whole
from ..formats.config import ModelConfig
from ..formats.ggml_types import loads_as
from .quantization import quant_setting
from .windows import attended, attention_windows


@dataclass(frozen=True)
class RankShare:
    """What one rank keeps of every layer: [start, stop) ranges."""

    rank: int
    kv_heads: tuple[int, int]
    q_heads: tuple[int, int]
    mlp_columns: tuple[int, int]


@dataclass(frozen=True)
class SplitPlan:
    ranks: int
    head_dim: int
    q_per_kv: int  # query heads that share one key/value head
    shares: tuple[RankShare, ...]

    def to_dict(self) -> dict:
        return {
            "ranks": self.ranks,
            "rule": "attention by groups of query heads sharing a KV head, MLP by intermediate columns; "
            "q/k/v and gate/up by output rows, o_proj and down_proj by input columns with one all_sum each; "
            "embedding, output table and norms whole on every rank",
            "shares": [asdict(s) for s in self.shares],
        }


def _even(n: int, parts: int) -> list[tuple[int, int]]:
    """[start, stop) for `parts` runs covering range(n), the first n % parts one longer."""
    out, start = [], 0
    for i in range(parts):
        stop = start + n // parts + (1 if i < n % parts else 0)
        out.append((start, stop))
        start = stop
    return out


def plan(cfg: ModelConfig, ranks: int, column_groups: dict[str, int] | None = None) -> SplitPlan:
    """The split for `ranks` ranks. column_groups: the quantization group size of o_proj and down_proj
    (their input columns are cut; 1 or absent for float), see `column_groups`."""
    check_whole(ranks, "ranks", 1, "a whole number, at least 1")
    problem = _problem(cfg, ranks, column_groups or {})
    if problem:
        fits = [n for n in range(2, cfg.num_key_value_heads + 1) if not _problem(cfg, n, column_groups or {})]
        fix = f"use {_words(fits)} ranks" if fits else "run it on one rank"
        raise MlxinferError(f"{problem}; {fix}")
    K, H, E = cfg.num_key_value_heads, cfg.num_attention_heads, cfg.head_dim
    unit = (column_groups or {}).get("down_proj", 1)
    mlp = [(a * unit, b * unit) for a, b in _even(cfg.intermediate_size // unit, ranks)]
    shares = tuple(RankShare(r, (a, b), (a * H // K, b * H // K), mlp[r]) for r, (a, b) in enumerate(_even(K, ranks)))
    return SplitPlan(ranks, E, H // K, shares)


def _problem(cfg: ModelConfig, ranks: int, groups: dict[str, int]) -> str | None:
    """Why `ranks` ranks cannot share this model, or None."""
    K, H, E, F = cfg.num_key_value_heads, cfg.num_attention_heads, cfg.head_dim, cfg.intermediate_size
    if ranks > K:
        return (
            f"{ranks} ranks but the model has {K} key/value head{'s' * (K != 1)}: attention splits by whole "
            f"KV heads (each with its {H // K} query heads), so at most {K} ranks can share it"
        )
    g = groups.get("o_proj", 1)
    for a, _ in _even(K, ranks)[1:]:
        if a * (H // K) * E % g:
            return (
                f"splitting attention across {ranks} ranks cuts o_proj's input at column {a * (H // K) * E}, "
                f"inside a quantization group of {g} (each KV group is {H // K} x {E} columns)"
            )
    unit = groups.get("down_proj", 1)
    if F % unit or F // unit < ranks:
        return (
            f"down_proj's {F:,} input columns in quantization groups of {unit} cannot be cut into {ranks} "
            "whole-group pieces"
        )
    return None


def _words(ns: list[int]) -> str:
    return ns[0].__str__() if len(ns) == 1 else ", ".join(map(str, ns[:-1])) + f" or {ns[-1]}"


def column_groups(cfg: ModelConfig, files: list[dict] | None = None, header=None) -> dict[str, int]:
    """The quantization group size of o_proj and down_proj (the matrices cut by input columns): the
    least common multiple over layers, 1 where they are float. From a GGUF header's tensor types (every
    quantized type loads as group 32: ggml_types.loads_as), the safetensors tables (in / scales
    columns), or else the config's quantization block."""
    ins = {"o_proj": cfg.num_attention_heads * cfg.head_dim, "down_proj": cfg.intermediate_size}
    sizes: dict[str, set[int]] = {"o_proj": set(), "down_proj": set()}
    if header is not None:
        gguf_kind = {"attn_output": "o_proj", "ffn_down": "down_proj"}
        for t in header.tensors:
            parts = t.name.split(".")
            if len(parts) == 4 and parts[2] in gguf_kind and loads_as(t.type_name).endswith(" g32"):
                sizes[gguf_kind[parts[2]]].add(32)
    elif files:
        for t in (t for f in files for t in f["tensors"]):
            kind = next((k for k in ins if t["name"].endswith(f"{k}.scales")), None)
            if kind and t["shape"] and t["shape"][-1] and ins[kind] % t["shape"][-1] == 0:
                sizes[kind].add(ins[kind] // t["shape"][-1])
    elif cfg.quantization:
        for i in range(cfg.num_hidden_layers):
            for kind, prefix in (("o_proj", "self_attn"), ("down_proj", "mlp")):
                s = quant_setting(cfg.quantization, f"model.layers.{i}.{prefix}.{kind}", ins[kind])
                if s is not None:
                    sizes[kind].add(s[1])
    return {k: math.lcm(*v) if v else 1 for k, v in sizes.items()}


# which share of a tensor a rank keeps, by its module name (Hugging Face's or GGUF's)
_KEEPS = {
    "q_proj": "q",
    "attn_q": "q",
    "k_proj": "kv",
    "attn_k": "kv",
    "v_proj": "kv",
    "attn_v": "kv",
    "o_proj": "q",
    "attn_output": "q",
    "gate_proj": "mlp",
    "ffn_gate": "mlp",
    "up_proj": "mlp",
    "ffn_up": "mlp",
    "down_proj": "mlp",
    "ffn_down": "mlp",
}
_WHOLE_BIAS = ("o_proj", "attn_output", "down_proj", "ffn_down")  # added once, after the all_sum


def kept(name: str, share: RankShare, cfg: ModelConfig) -> tuple[int, int]:
    """(numerator, denominator): the fraction of tensor `name` that this rank keeps."""
    *_, module, part = name.split(".")
    keeps = _KEEPS.get(module)
    if keeps is None or (part == "bias" and module in _WHOLE_BIAS):
        return 1, 1
    (a, b), whole = {
        "q": (share.q_heads, cfg.num_attention_heads),
        "kv": (share.kv_heads, cfg.num_key_value_heads),
        "mlp": (share.mlp_columns, cfg.intermediate_size),
    }[keeps]
    return b - a, whole


def per_rank(cfg: ModelConfig, p: SplitPlan, tensors: list[tuple[str, int]], kv_bytes: int, context: int) -> dict:
    """Memory per rank: weights (tensors: (name, bytes as stored)) and the KV cache at `context` tokens
    (kv_bytes per value); and what a token costs in communication."""
    L, E, D = cfg.num_hidden_layers, cfg.head_dim, cfg.hidden_size
    whole = sum(n for _, n in tensors)
    replicated = sum(n for name, n in tensors if kept(name, p.shares[0], cfg) == (1, 1))
    held = attended(context, attention_windows(cfg))  # layers x tokens kept: a window caps its layer's
    one_kv = 2 * cfg.num_key_value_heads * E * kv_bytes * held
    rows = []
    for s in p.shares:
        weights = sum(n * k // d for name, n in tensors for k, d in [kept(name, s, cfg)])
        kv = 2 * (s.kv_heads[1] - s.kv_heads[0]) * E * kv_bytes * held
        rows.append({**asdict(s), "weight_bytes": weights, "kv_cache_bytes": kv, "total_bytes": weights + kv})
    per_token = 2 * L * D * kv_bytes  # two all_sums of D values per layer
    return {
        "ranks": p.ranks,
        "context": context,
        "plan": p.to_dict(),
        "per_rank": rows,
        "one_process": {"weight_bytes": whole, "kv_cache_bytes": one_kv, "total_bytes": whole + one_kv},
        "replicated_bytes": replicated,
        "communication": {
            "all_sums_per_token": 2 * L,
            "values_per_all_sum": D,
            "bytes_summed_per_token": per_token,
            # a ring all-reduce sends (and receives) 2 (N - 1) / N of the buffer per rank
            "bytes_sent_per_rank_per_token": per_token * 2 * (p.ranks - 1) // p.ranks,
        },
    }
