"""The count report as text: the lesson's parameter table, then operations, hardware, quantization,
what is stored and the split across ranks (cli/commands/count.py renders a CountReport with it)."""

from __future__ import annotations

import math
import textwrap


def render(r) -> str:
    c = r.config
    tied = "one table for both ends (tied)" if c["tie_word_embeddings"] else "separate output table"
    out = [
        f"{r.model}",
        f"{c['model_type']}: {r.num_layers} layers, hidden {c['hidden_size']:,}, "
        f"vocabulary {c['vocab_size']:,}, {r.dtype}, {tied}",
        "",
    ]
    if r.experts:
        e = r.experts
        out[1] += f"; {e['experts_per_token']} of {e['num_experts']} experts per token"
    out += _block([(x["indent"], x["label"], x["formula"], _n(x["params"]), "") for x in r.rows])
    q = r.quantization
    as_stored = (  # a quantized model's own bytes beside the unquantized ones (its section below says how)
        [(0, "bytes as quantized", f"{q['bits_per_parameter']:.3f} bits a parameter", _n(q["bytes"]), _gb(q["bytes"]))]
        if q
        else []
    )
    out += _section(
        "Bytes and shares",
        [
            (
                0,
                f"bytes in {r.dtype}" + (", unquantized" if q else ""),
                f"{r.total:,} x {r.bytes_per_parameter}",
                _n(r.bytes),
                _gb(r.bytes),
            ),
            *as_stored,
            (0, "MLP share of a layer", f"{r.mlp:,} / {r.layer:,}", _pct(r.shares["mlp_of_layer"]), ""),
            (
                0,
                "attention share of a layer",
                f"{r.attention:,} / {r.layer:,}",
                _pct(r.shares["attention_of_layer"]),
                "",
            ),
            (0, "layers' share of the model", f"{r.layers:,} / {r.total:,}", _pct(r.shares["layers_of_model"]), ""),
            (
                0,
                "vocabulary tables' share",
                f"{r.embedding + r.output_table:,} / {r.total:,}",
                _pct(r.shares["vocab_tables_of_model"]),
                "",
            ),
        ],
    )
    out += _experts(r) + _operations(r)
    out += _hardware(r) + _quantization(r) + _stored(r) + _ranks(r)
    if r.notes:
        out += [""] + [_wrap(f"note: {n}") for n in r.notes]
    return "\n".join(out)


def _wrap(text: str) -> str:
    return textwrap.fill(text, 100, subsequent_indent="  ")


def _experts(r) -> list[str]:
    e = r.experts
    if not e:
        return []
    n, k, layers = e["num_experts"], e["experts_per_token"], e["layers_with_experts"]
    rows = [
        (0, "all experts", f"{layers} layers x {n} x {e['per_expert']:,}", _n(e["experts_total"]), ""),
        (0, "everything else", "embedding, attention, routers, norms, output", _n(r.total - e["experts_total"]), ""),
        (0, "active experts", f"{layers} layers x {k} x {e['per_expert']:,}", _n(e["experts_active"]), ""),
        (0, "active per token", "everything else + active experts", _n(e["active"]), _words(e["active"])),
        (0, "active share", f"{e['active']:,} / {r.total:,}", _pct(e["active_share"]), ""),
    ]
    return _section("Mixture of experts: what one token runs", rows) + [_wrap(f"rule: {e['rule']}")]


def _operations(r) -> list[str]:
    o, c = r.operations, r.config
    rows = [
        (0, "all parameters", "", _n(r.total), "")
        if not r.experts
        else (0, "active parameters", "the router's k experts only", _n(r.experts["active"]), ""),
        (0, "minus the embedding table", "", f"- {r.embedding:,}", "a lookup, no arithmetic"),
    ]
    if c["tie_word_embeddings"]:
        rows.append(
            (0, "plus the output matmul", "on the shared table", f"+ {r.embedding:,}", "scores for every token")
        )
    rows += [
        (0, "parameters used in arithmetic", "", _n(o["parameters_in_arithmetic"]), ""),
        (0, "x 2 operations each", "", _n(o["weights_per_token"]), _words(o["weights_per_token"])),
        (
            0,
            "attention per earlier token",
            f"{r.num_layers} layers x 2 x 2 x ({c['num_attention_heads']} x {c['head_dim']})",
            _n(o["attention_per_earlier_token"]),
            "q.k, then the value mix",
        ),
    ]
    if o["crossover_context"] is not None:
        rows.append(
            (
                0,
                "crossover context",
                f"{o['weights_per_token']:,} / {o['attention_per_earlier_token']:,}"
                if not o["windowed_layers"]
                else f"windowed layers capped at {o['sliding_window']:,}",
                f"{o['crossover_context']:,.0f}",
                "tokens: beyond it, attention outweighs the weights",
            )
        )
    if o["crossover_context"] is None and o["windowed_layers"] == r.num_layers:
        rows.append((0, "crossover context", "every layer windowed", "never", "attention stays below the weights"))
    out = _section("Operations per token", rows) + [_wrap(f"rule: {o['rule']}")]
    if r.context:
        x = r.context
        out += _section(
            f"At a context of {x['tokens']:,} tokens",
            [
                (
                    0,
                    "attention",
                    f"{o['attention_per_earlier_token']:,} x {x['tokens']:,}"
                    if not o["windowed_layers"]
                    else f"{o['attention_per_layer_token']:,} x {x['attended_layer_tokens']:,} layer-tokens",
                    _n(x["attention_ops"]),
                    _words(x["attention_ops"]),
                ),
                (0, "weights", "", _n(o["weights_per_token"]), _words(o["weights_per_token"])),
                (0, "attention as a share of the weights' work", "", _pct(x["share_of_weights"]), ""),
                (0, "this token in all", "", _n(x["total_ops"]), _words(x["total_ops"])),
            ],
        )
        if x["beyond_max_context"]:
            given = "" if x["max_context_given"] else ", the architecture's default: config.json does not set it"
            out.append(f"note: beyond the model's max_position_embeddings ({c['max_position_embeddings']:,}{given})")
    if r.answer:
        a = r.answer
        out += _section(
            f"An answer of {a['answer_tokens']:,} tokens after {a['prompt_tokens']:,}",
            [
                (0, "passes, one after another", "", _n(a["passes"]), ""),
                (0, "layer runs", f"{a['passes']:,} x {r.num_layers}", _n(a["layer_runs"]), ""),
                (
                    0,
                    "arithmetic, weights",
                    f"{a['passes']:,} x {o['weights_per_token']:,}",
                    _n(a["weights_ops"]),
                    _words(a["weights_ops"]),
                ),
                (
                    0,
                    "arithmetic, attention",
                    f"{o['attention_per_earlier_token']:,} x {a['attended_tokens']:,}"
                    if not o["windowed_layers"]
                    else f"{o['attention_per_layer_token']:,} x {a['attended_layer_tokens']:,} layer-tokens",
                    _n(a["attention_ops"]),
                    _words(a["attention_ops"]),
                ),
                (0, "total for the answer", "", _n(a["total_ops"]), _words(a["total_ops"])),
            ],
        )
        out.append(
            _wrap(
                f"attended tokens: pass k (k = 0 .. {a['passes'] - 1}) looks at {a['prompt_tokens']:,} + k"
                f" tokens, summed exactly: {a['attended_tokens']:,} (average {a['average_attended']:,.1f})"
                + (f"; a windowed layer looks at {o['sliding_window']:,} at most" if o["windowed_layers"] else "")
            )
        )
    return out


def _hardware(r) -> list[str]:
    h = r.hardware
    if not h:
        return []
    o = r.operations
    at = f"at a context of {h['context']:,}" if h["context"] else "weights only, no context"
    rows = [
        (0, "operations", at, _n(h["ops"]), _words(h["ops"])),
        (
            0,
            "bytes read",
            "weights" + (" + KV cache" if h["context"] else ""),
            _n(h["bytes_read"]),
            _gb(h["bytes_read"]),
        ),
    ]
    if h["context"]:
        rows.append(
            (
                1,
                "of which KV cache",
                _kv_formula(o, h["context"]),
                _n(h["kv_cache_bytes"]),
                "",
            )
        )
    if h["flops"]:
        rows.append((0, "compute-bound time", f"{h['ops']:,} / {_rate(h['flops'], 'FLOP/s')}", _t(h["compute_s"]), ""))
    if h["bandwidth"]:
        rows.append(
            (0, "memory-bound time", f"{h['bytes_read']:,} / {_rate(h['bandwidth'], 'B/s')}", _t(h["memory_s"]), "")
        )
    rows.append((0, "operations per byte read", "", f"{h['ops_per_byte']:,.2f}", ""))
    if h["binds"]:
        rows.append(
            (0, "the machine's operations per byte", "flops / bandwidth", f"{h['machine_ops_per_byte']:,.1f}", "")
        )
    for bound in ("compute", "memory"):  # each one its rate was given for
        if h.get(f"answer_{bound}_s"):
            rows.append((0, f"whole answer, {bound}-bound", "", _t(h[f"answer_{bound}_s"]), ""))
    out = _section("Time per token", rows)
    if h["binds"]:
        slow, fast = sorted((h["memory_s"], h["compute_s"]), reverse=True)
        out.append(
            _wrap(
                f"{h['binds']} binds: the {h['binds']}-bound time is {slow / fast:,.0f}x the other "
                "(memory binds whenever operations per byte read < the machine's operations per byte)"
            )
        )
    return out


def _quantization(r) -> list[str]:
    q = r.quantization
    if not q:
        return []
    if q["kind"] == "gguf":
        rows = [
            (
                0,
                f"{name}, {d['tensors']} tensor{'s' * (d['tensors'] != 1)}",
                f"{d['parameters']:,} parameters",
                _n(d["bytes"]),
                f"bytes, {d['bits_per_weight']:.2f} bits per weight; loads {d['loads_as']}",
            )
            for name, d in q["types"].items()
        ]
    else:
        rows = [(0, setting, "weights", _n(n), "") for setting, n in q["settings"].items()]
        rows += [
            (
                0,
                "bits per quantized weight",
                f"{q['mode']}: bits + scale/bias bits per group",
                f"{q['bits_per_quantized_weight']:.3g}",
                "",
            ),
            (
                0,
                "left in float (norms, biases, skipped)",
                f"{q['float_parameters']:,} x {r.bytes_per_parameter}",
                _n(q["float_parameters"] * r.bytes_per_parameter),
                "bytes",
            ),
        ]
    rows += [
        (0, "bits per parameter, overall", "", f"{q['bits_per_parameter']:.3f}", ""),
        (
            0,
            "tensor bytes" + ("" if q["kind"] == "gguf" else ", expected on disk"),
            "",
            _n(q["bytes"]),
            _gb(q["bytes"]),
        ),
    ]
    out = _section("Quantized weights" + (" (GGUF tensor table)" if q["kind"] == "gguf" else ""), rows)
    if q["kind"] == "gguf":  # llama.cpp's loader lines, as it prints them
        size = q["bytes"] / 2**30 if q["bytes"] >= 2**30 else q["bytes"] / 2**20
        unit = "GiB" if q["bytes"] >= 2**30 else "MiB"
        out += [f"llama.cpp: file type = {q['file_type']}", f"llama.cpp: file size = {size:.2f} {unit} "
                f"({q['bits_per_parameter']:.2f} BPW)"]  # fmt: skip
    return out


def _stored(r) -> list[str]:
    s = r.stored
    if not s:
        return []
    rows = [
        (0, f"{s['format']} files", "", _n(len(s["files"])), ""),
        (0, "tensors", "", _n(s["tensors"]), ""),
        (0, "values stored", "", _n(s["parameters"]), f"vs {r.total:,} unique parameters counted"),
        (0, "bytes of tensors", "", _n(s["tensor_bytes"]), _gb(s["tensor_bytes"])),
    ]
    if s["file_bytes"] is not None:
        rows += [
            (0, "file size", "", _n(s["file_bytes"]), _gb(s["file_bytes"])),
            (0, "difference (the header)", "", _n(s["header_bytes"]), "bytes"),
        ]
    return _section("As stored", rows) + [_wrap(f"- {n}") for n in s["notes"]]


def _ranks(r) -> list[str]:
    x = r.ranks
    if not x:
        return []
    one, c = x["one_process"], x["communication"]
    rows = []
    for s in x["per_rank"]:
        (qa, qb), (ka, kb), (ma, mb) = s["q_heads"], s["kv_heads"], s["mlp_columns"]
        rows += [
            (0, f"rank {s['rank']}", f"{qb - qa} query heads, {kb - ka} KV, {mb - ma:,} MLP columns", "", ""),
            (1, "weights", "", _n(s["weight_bytes"]), _gb(s["weight_bytes"])),
            (1, f"KV cache at {x['context']:,} tokens", "", _n(s["kv_cache_bytes"]), _gb(s["kv_cache_bytes"])),
            (1, "total", "", _n(s["total_bytes"]), _gb(s["total_bytes"])),
        ]
    rows += [
        (0, "one process, for comparison", "weights + KV cache", _n(one["total_bytes"]), _gb(one["total_bytes"])),
        (0, "held whole on every rank", "embedding, output table, norms", _n(x["replicated_bytes"]), "bytes"),
        (
            0,
            "communication per token",
            f"{c['all_sums_per_token']} all_sums of {c['values_per_all_sum']:,} values",
            _n(c["bytes_summed_per_token"]),
            f"bytes; a ring sends {c['bytes_sent_per_rank_per_token']:,} per rank",
        ),
    ]
    return _section(f"Split across {x['ranks']} ranks (tensor parallel)", rows)


# ---- layout ----------------------------------------------------------------------------------------------


def _section(title: str, rows) -> list[str]:
    return ["", title, *_block(rows)]


def _block(rows) -> list[str]:
    """Rows of (indent, label, formula, value, note): labels left, '=' and values aligned right."""
    labels = ["  " * i + label for i, label, *_ in rows]
    lw = max(len(x) for x in labels)
    fw = max(len(f) for _, _, f, _, _ in rows)
    vw = max(len(v) for *_, v, _ in rows)
    lines = []
    for label, (_, _, formula, value, note) in zip(labels, rows):
        line = f"{label:<{lw}}  {formula:<{fw}}  " + (f"= {value:>{vw}}" if value else "")
        lines.append((line + (f"   {note}" if note else "")).rstrip())
    return lines


def _n(x) -> str:
    return "" if x is None else f"{x:,}"


def _pct(x: float) -> str:
    return f"{x:.0%}"


def _gb(x: int) -> str:
    return f"{x / 1e9:.2f} GB" if x >= 1e8 else f"{x / 1e6:.2f} MB"


def _sig3(x: float) -> str:
    """Three significant digits, keeping trailing zeros: 15.0, 4.50, 269."""
    return f"{x:.{max(0, 2 - math.floor(math.log10(x)))}f}"


def _words(x: int) -> str:
    for size, word in ((1e12, "trillion"), (1e9, "billion"), (1e6, "million")):
        if x >= size:
            return f"about {_sig3(x / size)} {word}"
    return ""


def _rate(x: float, unit: str) -> str:
    for size, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if x >= size:
            return f"{x / size:.4g} {prefix}{unit}"
    return f"{x:.4g} {unit}"


def _t(s: float | None) -> str:
    if s is None:
        return ""
    for size, unit in ((1, "s"), (1e-3, "ms"), (1e-6, "us")):
        if s >= size:
            return f"{_sig3(s / size)} {unit}"
    return f"{_sig3(s * 1e9)} ns"


def _kv_formula(o: dict, context: int) -> str:
    if not o["windowed_layers"]:
        return f"{o['kv_cache_bytes_per_context_token']:,} x {context:,}"
    return f"{o['windowed_layers']} of the layers hold the last {o['sliding_window']:,} tokens only"
