"""What is on disk: safetensors headers, shards and their index, hub metadata, GGUF tensor
tables, read without loading a framework (no mlx, mlx-lm, transformers or numpy) and
never a weight. huggingface_hub is imported only for a hub repo id. `counting` compares
these figures with what config.json implies.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from . import gguf, sources
from .config import ModelConfig
from .errors import MlxinferError

# safetensors dtype -> bytes per value
ST_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2,
             "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
MAX_HEADER = 100_000_000  # safetensors caps its JSON header at 100 MB


# ---- sources ---------------------------------------------------------------------------------------------


def open_source(source):
    """-> (name, kind, config, safetensors files or None, GGUF header or None, notes)."""
    text = "" if source is None else str(source)
    path = Path(text).expanduser()
    if path.suffix == ".safetensors" and path.is_file():  # a weights file: count its folder
        path = path.parent
    if text and path.is_file() and path.suffix == ".json":  # any config file; the folder's weights for config.json
        files = _local_files(path.parent) if path.name == "config.json" else None
        return text, "config", ModelConfig.from_file(path), files, None, []
    if not text or path.exists():  # nothing: the embedded GGUF
        src = sources.resolve(path if text else None)
        if src.kind == "gguf":
            h = gguf.read_header(src.path, tokenizer=False)
            return src.name, "gguf", gguf.config_from_header(h), None, h, []
        return text, "config", ModelConfig.from_file(src.path), _local_files(src.path), None, []
    local = text.endswith((".gguf", ".json", ".safetensors")) or text.startswith((".", "/", "~"))
    if local or not sources.REPO_ID.match(text):
        raise MlxinferError(f"no model at {text}: not a local path, and not a hub repo id like 'owner/name'")
    cfg, files, notes = _hub(text)
    return text, "hub", cfg, files, None, notes


def _local_files(folder: Path) -> list[dict] | None:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise MlxinferError(f"{index} is not a valid index (no 'weight_map'); re-download it") from None
        for n in names:
            if not (folder / n).is_file():
                raise MlxinferError(f"{index} lists {n}, which is not in {folder}; download every shard")
    else:
        names = sorted(p.name for p in folder.glob("*.safetensors"))
    return [read_safetensors_header(folder / n) for n in names] or None


def read_safetensors_header(path: Path) -> dict:
    """A safetensors file: 8-byte little-endian header length, a JSON header, then the tensor bytes."""
    size = path.stat().st_size
    bad = f"{path} has a corrupt safetensors header"
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise MlxinferError(f"{bad} (file of {size} bytes); re-download it")
        (n,) = struct.unpack("<Q", head)
        if n > min(MAX_HEADER, size - 8):
            raise MlxinferError(f"{bad} (header length {n:,} in a {size:,}-byte file); re-download it")
        try:
            header = json.loads(f.read(n))
        except (ValueError, UnicodeDecodeError):
            raise MlxinferError(f"{bad} (not JSON); re-download it") from None
    if not isinstance(header, dict):
        raise MlxinferError(f"{bad} (not a JSON object); re-download it")
    return _file_entry(path.name, header, size, 8 + n, str(path))


def _file_entry(name: str, header: dict, file_bytes: int | None, head: int | None, where: str) -> dict:
    tensors = []
    for tname, t in header.items():
        if tname == "__metadata__":
            continue
        try:
            shape, dtype = [int(d) for d in t["shape"]], t["dtype"]
            start, end = (int(x) for x in t["data_offsets"])
            n = math.prod(shape)
        except (KeyError, TypeError, ValueError):
            raise MlxinferError(f"{where} has a corrupt safetensors header (entry {tname!r})") from None
        if not 0 <= start <= end or (dtype in ST_DTYPES and end - start != n * ST_DTYPES[dtype]) or (
                file_bytes is not None and head + end > file_bytes):
            raise MlxinferError(f"{where} has a corrupt safetensors header ({tname} does not fit its bytes)")
        tensors.append({"name": tname, "dtype": dtype, "shape": shape, "params": n, "bytes": end - start})
    return {"name": name, "file_bytes": file_bytes, "header_bytes": head, "tensors": tensors}


def _hub(repo_id: str) -> tuple[ModelConfig, list[dict] | None, list[str]]:
    """config.json and the safetensors headers only: never a weight."""
    import huggingface_hub as hub
    from huggingface_hub import errors

    try:
        cfg = ModelConfig.from_file(hub.hf_hub_download(repo_id, "config.json"))
    except errors.LocalEntryNotFoundError:
        off = " (HF_HUB_OFFLINE is set)" if sources.offline() else ""
        raise MlxinferError(f"{repo_id}: config.json is not in the local Hugging Face cache and the hub "
                            f"cannot be reached{off}; try again online or pass a local path") from None
    except (errors.RepositoryNotFoundError, errors.GatedRepoError):
        raise MlxinferError(f"no accessible repository {repo_id} on the Hugging Face hub; check the id") from None
    except (errors.HfHubHTTPError, OSError) as e:  # EntryNotFoundError too: no config.json
        raise MlxinferError(f"could not read {repo_id}/config.json from the hub: {_first(e)}") from None
    try:
        meta = hub.get_safetensors_metadata(repo_id)
    except errors.NotASafetensorsRepoError:
        return cfg, None, [f"{repo_id} has no safetensors files; counted from config.json alone"]
    except (errors.HfHubHTTPError, errors.SafetensorsParsingError, OSError) as e:
        return cfg, None, [f"safetensors headers not read ({_first(e)}); counted from config.json alone"]
    try:
        sizes = {p.path: p.size for p in hub.get_paths_info(repo_id, list(meta.files_metadata))}
    except (errors.HfHubHTTPError, OSError):
        sizes = {}
    files = []
    for fname, fm in sorted(meta.files_metadata.items()):
        header = {k: {"dtype": t.dtype, "shape": t.shape, "data_offsets": t.data_offsets}
                  for k, t in fm.tensors.items()}
        end = max((t.data_offsets[1] for t in fm.tensors.values()), default=0)
        size = sizes.get(fname)
        files.append(_file_entry(fname, header, size, None if size is None else size - end, repo_id))
    return cfg, files, []


def _first(e: Exception) -> str:
    return (str(e).splitlines() or [type(e).__name__])[0]


# ---- what is stored --------------------------------------------------------------------------------------


def stored_safetensors(files: list[dict], cfg: ModelConfig, names: list[str], total: int, predicted: int) -> dict:
    """The stored tensors against `names`, the tensors the config implies (in order)."""
    expected = dict.fromkeys(names)
    stored = {t["name"]: t for f in files for t in f["tensors"]}
    quant = {n for n in stored if n.endswith((".scales", ".biases")) and n.rsplit(".", 1)[0] + ".weight" in expected}
    extra = {n: stored[n]["params"] for n in stored if n not in expected and n not in quant}
    missing = [n for n in expected if n not in stored]
    s = _sums(files, "safetensors")
    s.update(unique_parameters=total, predicted_bytes=predicted, extra=extra, missing=missing,
             quantization_bytes=sum(stored[n]["bytes"] for n in quant))
    notes = s["notes"]
    diff = s["tensor_bytes"] - predicted
    notes.append(f"tensor bytes {s['tensor_bytes']:,} vs {predicted:,} predicted from the config: "
                 + ("equal" if diff == 0 else f"{diff:+,} bytes"))
    for n, p in extra.items():
        why = "the tied vocabulary table stored a second time" if (
            n == "lm_head.weight" and cfg.tie_word_embeddings) else "a tensor the config does not describe"
        notes.append(f"{n}: {why} (+{p:,} parameters, +{stored[n]['bytes']:,} bytes)")
    if missing:
        notes.append(f"{len(missing)} tensors the config implies are not stored, e.g. {missing[0]}")
    if quant:
        notes.append(f"quantized: packed weights plus {len(quant):,} scales/biases tensors "
                     f"({s['quantization_bytes']:,} bytes); stored values are packed, not parameters")
    elif not extra and not missing and s["parameters"] == total:
        notes.append("every parameter is stored exactly once")
    return s


def stored_gguf(h: gguf.GGUFHeader, total: int) -> dict:
    t = [{"name": x.name, "params": x.n_elements, "bytes": x.nbytes} for x in h.tensors]
    head = h.file_size - sum(x.nbytes for x in h.tensors)  # metadata, tensor table, alignment padding
    s = _sums([{"name": h.path.name, "file_bytes": h.file_size, "header_bytes": head, "tensors": t}], "gguf")
    s["unique_parameters"] = total
    diff = s["parameters"] - total
    s["notes"].append("every parameter is stored exactly once (a tied table is stored once, as token_embd)"
                      if diff == 0 else f"{diff:+,} parameters stored beyond the count")
    return s


def _sums(files: list[dict], fmt: str) -> dict:
    tensor_bytes = sum(t["bytes"] for f in files for t in f["tensors"])
    sizes = [f["file_bytes"] for f in files]
    file_bytes = None if None in sizes else sum(sizes)
    header = None if file_bytes is None else file_bytes - tensor_bytes
    notes = [] if header is None else [
        f"header: {header:,} bytes over {len(files)} file(s): the file size minus the tensors' bytes"
        + (" (8-byte length + JSON table of names, dtypes, shapes, offsets)" if fmt == "safetensors" else
           " (metadata, tensor table, alignment padding)")]
    return {"format": fmt, "files": [{k: f[k] for k in ("name", "file_bytes", "header_bytes")} |
                                     {"tensors": len(f["tensors"])} for f in files],
            "tensors": sum(len(f["tensors"]) for f in files),
            "parameters": sum(t["params"] for f in files for t in f["tensors"]),
            "tensor_bytes": tensor_bytes, "file_bytes": file_bytes, "header_bytes": header, "notes": notes}
