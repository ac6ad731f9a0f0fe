"""A model's fingerprint: digests that two copies of the same model share, wherever their files lie.

Ranks that split a model must each hold the same one: a different config or tokenizer puts the
ranks' collectives out of step, different weights give wrong numbers silently. Reading every
weight byte would cost as much as loading, so the fingerprint hashes what describes the model
(config, tokenizer and generation files; each weight file's header, which lists every tensor's
name, dtype, shape and offset) and samples of the weight bytes at the start, middle and end of
each weight file. Paths and file times are left out: they differ between machines.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

from ..errors import MlxinferError
from . import safetensors
from .sources import DESCRIBING_FILES, ModelSource

PARTS = ("config and tokenizer files", "tensor table", "weight bytes (sampled)")
DESCRIBING = (*DESCRIBING_FILES, "tokenizer.model")  # a local directory may hold a sentencepiece model too
SAMPLE = 1 << 16  # bytes read at each of three places in a weight file
DIGEST = 8  # bytes kept of each sha256


def fingerprint(src: ModelSource, gguf_data_offset: int | None = None) -> list[bytes]:
    """One digest per entry of PARTS. A GGUF's header (metadata with its tokenizer, and the tensor
    table) ends at `gguf_data_offset` (GGUFHeader.data_offset) and counts as both of the first two."""
    describing, table, weights = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()
    try:
        if src.kind == "gguf":
            with open(src.path, "rb") as f:
                head = f.read(gguf_data_offset)
            describing.update(head)
            table.update(head)
            _sample(weights, src.path, gguf_data_offset)
        else:
            for name in DESCRIBING:
                if (src.path / name).is_file():
                    describing.update(name.encode() + b"\0" + (src.path / name).read_bytes())
            for name in safetensors.shard_names(src.path):
                path = src.path / name
                with open(path, "rb") as f:
                    (n,) = struct.unpack("<Q", f.read(8).ljust(8, b"\0"))
                    head = f.read(min(n, safetensors.MAX_HEADER))
                table.update(name.encode() + b"\0" + head)
                _sample(weights, path, 8 + len(head))
    except OSError as e:
        raise MlxinferError(
            f"{src.name}: cannot read the model's files ({e.strerror}: {e.filename})", "source"
        ) from None
    return [h.digest()[:DIGEST] for h in (describing, table, weights)]


def _sample(h, path: Path, start: int) -> None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        for at in (start, (start + size) // 2, size - SAMPLE):
            f.seek(max(start, at))
            h.update(f.read(SAMPLE))
