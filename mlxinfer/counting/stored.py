"""What a checkpoint actually stores, against what its config implies: the safetensors or GGUF
tables (read by formats/, never a weight) summed and compared, with a note for every difference."""

from __future__ import annotations

from ..errors import MlxinferError
from ..formats import gguf
from ..formats.config import ModelConfig
from .layout import stacked_name


def stored_safetensors(files: list[dict], cfg: ModelConfig, names: list[str], total: int, predicted: int) -> dict:
    """The stored tensors against `names`, the tensors the config implies (in order)."""
    expected = dict.fromkeys(names)
    stored: dict[str, dict] = {}
    for t in (t for f in files for t in f["tensors"]):  # Hugging Face's per-expert tensors, gathered
        entry = stored.setdefault(stacked_name(t["name"]), {"params": 0, "bytes": 0})
        entry["params"] += t["params"]
        entry["bytes"] += t["bytes"]
    quant = {n for n in stored if n.endswith((".scales", ".biases")) and n.rsplit(".", 1)[0] + ".weight" in expected}
    extra = {n: stored[n]["params"] for n in stored if n not in expected and n not in quant}
    missing = [n for n in expected if n not in stored]
    s = _sums(files, "safetensors")
    s.update(
        unique_parameters=total,
        predicted_bytes=predicted,
        extra=extra,
        missing=missing,
        quantization_bytes=sum(stored[n]["bytes"] for n in quant),
    )
    notes = s["notes"]
    diff = s["tensor_bytes"] - predicted
    notes.append(
        f"tensor bytes {s['tensor_bytes']:,} vs {predicted:,} predicted from the config: "
        + ("equal" if diff == 0 else f"{diff:+,} bytes")
    )
    for n, p in extra.items():
        why = (
            "the tied vocabulary table stored a second time"
            if (n == "lm_head.weight" and cfg.tie_word_embeddings)
            else "a tensor the config does not describe"
        )
        notes.append(f"{n}: {why} (+{p:,} parameters, +{stored[n]['bytes']:,} bytes)")
    if missing:
        notes.append(f"{len(missing)} tensors the config implies are not stored, e.g. {missing[0]}")
    if quant:
        notes.append(
            f"quantized: packed weights plus {len(quant):,} scales/biases tensors "
            f"({s['quantization_bytes']:,} bytes); stored values are packed, not parameters"
        )
    elif not extra and not missing and s["parameters"] == total:
        notes.append("every parameter is stored exactly once")
    return s


def stored_gguf(h: gguf.GGUFHeader, total: int, implied: dict[str, tuple] | None = None) -> dict:
    """The tensor table summed, against `total` and (where given) each tensor's shape the metadata implies,
    by Hugging Face names."""
    t = [{"name": x.name, "params": x.n_elements, "bytes": x.nbytes} for x in h.tensors]
    head = h.file_size - sum(x.nbytes for x in h.tensors)  # metadata, tensor table, alignment padding
    s = _sums([{"name": h.path.name, "file_bytes": h.file_size, "header_bytes": head, "tensors": t}], "gguf")
    s["unique_parameters"] = total
    wrong = _wrong_shapes(h, implied or {})
    if wrong:
        name, shape, want = wrong[0]
        s["notes"].append(
            f"tensor '{name}' has shape {shape} but the file's metadata implies {want}"
            + (f" ({len(wrong) - 1:,} more like it)" if len(wrong) > 1 else "")
            + ": the metadata and the tensors disagree (the model will not load); re-convert or re-download it"
        )
    rope = next((x.n_elements for x in h.tensors if x.name == "rope_freqs.weight"), 0)
    if rope:
        s["notes"].append(f"rope_freqs.weight: Llama 3's RoPE scaling, one factor per rotary pair ({rope:,} values)")
    diff = s["parameters"] - rope - total
    if wrong:  # the sums differ because of it: the note above says why
        more = "more" if diff > 0 else "fewer"
        s["notes"].append(f"{abs(diff):,} parameters {more} stored than the config implies: the shapes above")
    else:
        s["notes"].append(
            "every parameter is stored exactly once (a tied table is stored once, as token_embd)"
            if diff == 0
            else f"{diff:+,} parameters stored beyond the count"  # e.g. a tensor the definition does not use
            if diff > 0
            else f"{-diff:,} parameters fewer stored than the config implies: a tensor's shape does not match the "
            "file's own metadata (the model will not load); re-convert or re-download it"
        )
    return s


def _wrong_shapes(h: gguf.GGUFHeader, implied: dict[str, tuple]) -> list[tuple]:
    wrong = []
    for x in h.tensors:
        try:
            want = implied.get(gguf.gguf_to_hf(x.name))
        except MlxinferError:  # a tensor with no place in the definition (rope_freqs): counted, not compared
            continue
        if want is not None and tuple(x.shape) != tuple(want):
            wrong.append((x.name, tuple(x.shape), tuple(want)))
    return wrong


def _sums(files: list[dict], fmt: str) -> dict:
    tensor_bytes = sum(t["bytes"] for f in files for t in f["tensors"])
    sizes = [f["file_bytes"] for f in files]
    file_bytes = None if None in sizes else sum(sizes)
    header = None if file_bytes is None else file_bytes - tensor_bytes
    notes = (
        []
        if header is None
        else [
            f"header: {header:,} bytes over {len(files)} file(s): the file size minus the tensors' bytes"
            + (
                " (8-byte length + JSON table of names, dtypes, shapes, offsets)"
                if fmt == "safetensors"
                else " (metadata, tensor table, alignment padding)"
            )
        ]
    )
    return {
        "format": fmt,
        "files": [
            {k: f[k] for k in ("name", "file_bytes", "header_bytes")} | {"tensors": len(f["tensors"])} for f in files
        ],
        "tensors": sum(len(f["tensors"]) for f in files),
        "parameters": sum(t["params"] for f in files for t in f["tensors"]),
        "tensor_bytes": tensor_bytes,
        "file_bytes": file_bytes,
        "header_bytes": header,
        "notes": notes,
    }
