"""Write an mlx-community style model directory, all or nothing.

Layout: config.json (with the `quantization` block and its `quantization_config` copy when quantized),
model.safetensors (or model-0000k-of-0000n.safetensors shards with model.safetensors.index.json when
the tensors exceed the shard size), tokenizer files, generation_config.json.

Everything is written into a temporary directory next to OUT and renamed into place at the end, so a
failure leaves no half-written OUT; an existing non-empty OUT is refused unless `force`. The temporary
directory is removed on an error, Ctrl-C, SIGTERM or SIGHUP, and by the next run if a SIGKILL left it
(mlxinfer/atomic.py).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import mlx.core as mx

from mlxinfer import defaults
from mlxinfer import atomic
from mlxinfer.errors import MlxinferError, OutputError, check_bool

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*", re.IGNORECASE)
_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_size(text: str | int) -> int:
    """'5GiB', '500MB', '100KB', 4096 -> bytes."""
    if isinstance(text, int):
        n = text
    else:
        m = _SIZE.fullmatch(str(text))
        if not m:
            raise MlxinferError(
                f"max_shard_bytes: cannot read the size {text!r}; write e.g. 5GB, 500MB or 2GiB", "max_shard_bytes"
            )
        n = int(float(m.group(1)) * _UNITS[(m.group(2) or "b").lower()])
    if n < 1:
        raise MlxinferError(f"max_shard_bytes must be positive, got {text!r}", "max_shard_bytes")
    return n


DEFAULT_SHARD_BYTES = parse_size(defaults.SHARD_SIZE)


def through_link(out: Path) -> Path:
    """OUT as written: a symbolic link to a directory is written through (the directory it names is
    replaced, the link stays), as atomic.staged_file writes through a link to a file."""
    return out.resolve() if out.is_symlink() and out.resolve().is_dir() else out


def check_output(out: Path, force: bool) -> None:
    """Before any work: OUT may be missing or an empty directory (or a link to one); a non-empty one only
    with force."""
    check_bool(force, "force")  # force="no" would replace a full directory
    out = through_link(out)
    if out.is_symlink():
        raise MlxinferError(f"{out} is a symbolic link to {os.readlink(out)}, not a directory; choose another out")
    if out.exists() and not out.is_dir():
        raise MlxinferError(f"{out} exists and is not a directory; choose another output directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise MlxinferError(
            f"{out} exists and is not empty; pass force to replace it, or choose another out", "force", "out"
        )


@contextmanager
def staged(out: Path, force: bool) -> Iterator[Path]:
    """Yield a temporary directory next to OUT; on success it replaces OUT, on any failure (or SIGTERM) it
    is removed (atomic.staged_dir). An OSError (a read-only place, a path under a file, a full disk) is a
    one-line error, and the parents made for OUT are removed too, those still empty."""
    out = through_link(Path(out).absolute())
    check_output(out, force)
    created = next((p for p in reversed([out.parent, *out.parent.parents]) if not p.exists()), None)
    with atomic.cleanup_on_signals():  # held until the parents made for OUT are gone as well
        try:
            with atomic.staged_dir(out, replace=True) as tmp:
                yield tmp
                check_output(out, force)  # nothing appeared meanwhile
        except BaseException as e:
            if created is not None:  # only while empty: another run (or the user) may have written there since
                for folder in [out.parent, *out.parent.parents]:
                    try:
                        folder.rmdir()
                    except FileNotFoundError:  # never made: the makedirs stopped above it
                        pass
                    except OSError:
                        break
                    if folder == created:
                        break
            if isinstance(e, OSError):
                raise _cannot_write(out, e) from None
            raise


def _cannot_write(out: Path, e: OSError) -> MlxinferError:
    blocker = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocker is not None:
        why = f"{blocker} is a file, not a directory"
    else:
        why = f"{e.strerror or e}" + (f" ({e.filename})" if e.filename and str(e.filename) != str(out) else "")
    return OutputError.of(e)(f"cannot write out {out}: {why}; choose a place you can write to", "out")


def save_weights(
    directory: Path, tensors: dict[str, mx.array], parameters: int, max_shard_bytes: int = DEFAULT_SHARD_BYTES
) -> list[str]:
    """model.safetensors, or shards plus model.safetensors.index.json past max_shard_bytes (mlx-lm's rule:
    a tensor larger than the limit gets a shard of its own)."""
    shards: list[dict[str, mx.array]] = []
    size = 0
    for name in sorted(tensors):
        v = tensors[name]
        if not shards or size + v.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = v
        size += v.nbytes
    n = len(shards)
    names = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    weight_map = {}
    for fname, shard in zip(names, shards):
        try:
            mx.save_safetensors(str(directory / fname), shard, metadata={"format": "mlx"})
        except (RuntimeError, ValueError) as e:  # mlx's way of saying the file could not be written
            need = sum(v.nbytes for v in shard.values())
            if shutil.disk_usage(directory).free < need:  # its message says neither why nor the fix
                raise OSError(errno.ENOSPC, "No space left on device", str(directory / fname)) from None
            raise OSError(
                errno.EIO, str(e).splitlines()[0] if str(e) else "write failed", str(directory / fname)
            ) from None
        weight_map.update({k: fname for k in shard})
    if n > 1:
        index = {
            "metadata": {"total_size": sum(v.nbytes for v in tensors.values()), "total_parameters": parameters},
            "weight_map": dict(sorted(weight_map.items())),
        }
        (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=4) + "\n")
        names.append("model.safetensors.index.json")
    return names


def save_config(directory: Path, config: dict) -> None:
    """Sorted like mlx-lm's save_config; the quantization block copied to quantization_config."""
    config = {k: v for k, v in config.items() if k != "_name_or_path"}
    if config.get("quantization"):
        config["quantization_config"] = config["quantization"]
    else:
        config.pop("quantization", None)
        config.pop("quantization_config", None)
    (directory / "config.json").write_text(json.dumps(dict(sorted(config.items())), indent=4) + "\n")


def copy_tokenizer_files(src: Path, directory: Path) -> None:
    found = False
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, directory / name)
            found = True
    if not found:
        raise MlxinferError(f"no tokenizer files in {src}; the output would have no tokenizer")


def save_gguf_tokenizer(tokenizer, directory: Path, max_length: int | None) -> None:
    """The tokenizer rebuilt from GGUF metadata, written by transformers (tokenizer.json,
    tokenizer_config.json, chat_template.jinja); the class named so older transformers load it too."""
    try:
        tokenizer._tokenizer.save_pretrained(str(directory))
    except Exception as e:  # the Rust tokenizers' I/O errors are plain Exceptions: "... (os error 28)"
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1])), str(directory / "tokenizer.json")) from None
    path = directory / "tokenizer_config.json"
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    if max_length:
        cfg["model_max_length"] = max_length
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def write_model_dir(
    out: Path,
    *,
    tensors: dict[str, mx.array],
    config: dict,
    parameters: int,
    write_tokenizer: Callable[[Path], None],
    generation_config: dict | None,
    force: bool = False,
    max_shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> list[dict]:
    """Write the whole directory atomically; returns [{name, bytes}] of its files."""
    with staged(out, force) as tmp:
        save_weights(tmp, tensors, parameters, max_shard_bytes)
        save_config(tmp, config)
        write_tokenizer(tmp)
        if generation_config:
            (tmp / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
    return [{"name": p.name, "bytes": p.stat().st_size} for p in sorted(Path(out).iterdir())]
