"""Safetensors files, read without a framework: the 8-byte header length, the JSON table of
names, dtypes, shapes and offsets, and a sharded checkpoint's index. Never a weight.

`count` compares these tables with what config.json implies; the loader (model/weights.py)
finds its shards here before `mx.load` reads them.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

from ..errors import MlxinferError
from .paths import MAX_TOKENIZER_BYTES, read_json_file, what_it_is

# safetensors dtype -> bytes per value
DTYPES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "U32": 4,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "U64": 8,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
}
MAX_HEADER = 100_000_000  # safetensors caps its JSON header at 100 MB
INDEX = "model.safetensors.index.json"


def shard_names(folder: Path) -> list[str]:
    """The checkpoint's safetensors files: those its index lists (each checked to exist), else every
    *.safetensors in the folder. Empty when there are none."""
    index = folder / INDEX
    if not index.is_file():
        found = sorted(folder.glob("*.safetensors"))
        for p in found:
            if p.is_symlink() and not p.exists():
                raise MlxinferError(
                    f"{p} is a link to a file that is gone (a partly deleted download?); re-download it"
                )
            if not p.is_file():  # a directory, or a link to a device (/dev/zero) or a pipe
                raise MlxinferError(f"{p} {what_it_is(p)}; put the model's safetensors weights file there")
        return [p.name for p in found]
    try:
        weight_map = read_json_file(index, "model.safetensors.index.json", MAX_TOKENIZER_BYTES)["weight_map"]
        names = sorted(set(weight_map.values()))
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OSError):
        raise MlxinferError(f"{index} is not a valid index (no 'weight_map'); re-download it") from None
    for name in names:
        if not isinstance(name, str) or "/" in name or not (folder / name).is_file():
            raise MlxinferError(f"{index} lists {name}, which is not in {folder}; download every shard")
    return names


def read_header(path: Path) -> dict:
    """One file's table: {name, file_bytes, header_bytes, tensors: [{name, dtype, shape, params, bytes}]}."""
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
        except (ValueError, RecursionError):
            raise MlxinferError(f"{bad} (not JSON); re-download it") from None
    if not isinstance(header, dict):
        raise MlxinferError(f"{bad} (not a JSON object); re-download it")
    return file_entry(path.name, header, size, 8 + n, str(path))


def file_entry(name: str, header: dict, file_bytes: int | None, head: int | None, where: str) -> dict:
    """A header's tensors, each checked to fit the bytes its dtype and shape need, none overlapping another."""
    tensors = []
    for tname, t in header.items():
        if tname == "__metadata__":
            continue
        try:
            shape, dtype, (start, end) = t["shape"], t["dtype"], t["data_offsets"]
            if not all(type(x) is int and x >= 0 for x in (start, end, *shape)) or max(shape, default=0) >= 2**31:
                raise ValueError  # a dimension must fit MLX's int32 shapes (it wraps silently otherwise)
            n = math.prod(shape)
        except (KeyError, TypeError, ValueError):
            raise MlxinferError(f"{where} has a corrupt safetensors header (entry {tname!r}); re-download it") from None
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise MlxinferError(
                f"{where}: tensor {tname!r} has dtype {str(dtype)[:20]!r}, which safetensors does not define; "
                "re-download it"
            )
        if not start <= end or end - start != n * DTYPES[dtype] or (file_bytes is not None and head + end > file_bytes):
            raise MlxinferError(
                f"{where} has a corrupt safetensors header ({tname} does not fit its bytes: a cut download?); "
                "re-download it"
            )
        tensors.append({"name": tname, "dtype": dtype, "shape": shape, "params": n, "bytes": end - start})
    spans = sorted((tuple(header[t["name"]]["data_offsets"]), t["name"]) for t in tensors if t["bytes"])
    for (a, first), (b, second) in zip(spans, spans[1:]):
        if b[0] < a[1]:
            raise MlxinferError(
                f"{where} has a corrupt safetensors header ({first} and {second} share bytes); re-download it"
            )
    return {"name": name, "file_bytes": file_bytes, "header_bytes": head, "tensors": tensors}


def local_files(folder: Path) -> list[dict] | None:
    """Every shard's table, or None when the folder holds no safetensors."""
    return [read_header(folder / n) for n in shard_names(folder)] or None
