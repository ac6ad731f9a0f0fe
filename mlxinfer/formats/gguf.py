"""GGUF files: the header (metadata and tensor table) in plain Python, and the
config it describes.

Reading the header needs no mlx, so `count` can use it; the tensors themselves
are read by `mx.load` in weights.py.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import MlxinferError, is_number, is_whole
from .architectures import GGUF
from .config import ModelConfig
from .ggml_types import GGML_TYPES
from .gguf_rope import rope_scaling

MAGIC = b"GGUF"

# the types mx.load reads (quantized ones arrive as MLX affine weights, group 32); model/gguf_tensors.py
# reads the others
MX_LOAD_TYPES = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0"}

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRUCTS = {t: struct.Struct(fmt) for t, fmt in _SCALARS.items()}
_U64 = _STRUCTS[10]
_STRING, _ARRAY, _FLOAT64 = 8, 9, 12
MAX_DIMS = 4  # ggml's GGML_MAX_DIMS
MAX_NESTING = 4  # arrays of arrays: GGUF files use one level; a deeper one is a corrupt header
# the fix a wrong value in the metadata read as a config gets (there is no config.json to fix; the value is
# named by its metadata key, GGUF_KEYS)
METADATA_FIX = "the file's metadata is wrong: re-download or re-convert it"
REDOWNLOAD = "re-download the file, or convert the model again"
GGUF_KEYS = {  # config.json's field -> the metadata key it is read from, under the architecture's name
    "vocab_size": "vocab_size",
    "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length",
    "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base",
    "max_position_embeddings": "context_length",
    "head_dim": "attention.key_length",
}
_FIELD = re.compile(r"\b(" + "|".join(GGUF_KEYS) + r")\b")


@dataclass
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # numpy order: rows first
    type_name: str
    offset: int  # from the start of the data section
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[GGUFTensor] = field(default_factory=list)
    data_offset: int = 0
    file_size: int = 0
    float64_keys: list[str] = field(default_factory=list)  # metadata holding FLOAT64: mx.load crashes on it

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


class _Reader:
    """Values read from a buffer holding the whole file (a memory map: pages are read as they are
    touched, so the tensor data is never read here). Every size read from the file is checked
    against the bytes left before anything is allocated or sliced; arrays are read in one step
    (numbers) or one tight loop over the buffer (strings) rather than a file read per value."""

    def __init__(self, buf, path: Path, size: int):
        self.buf, self.path, self.size, self.pos = buf, path, size, 0
        self.key, self.float64_keys = "", []

    def _truncated(self) -> MlxinferError:
        return MlxinferError(f"{self.path} is truncated (its header ends early); re-download the file")

    def read(self, n: int) -> bytes:
        if n > self.size - self.pos:  # checked first: a slice past the end would come back short
            raise self._truncated()
        start = self.pos
        self.pos += n
        return self.buf[start : self.pos]

    def count(self, what: str, item_bytes: int) -> int:
        """A count read from the file, checked against the bytes left (each item needs `item_bytes`)."""
        n = self.scalar(10)
        if n * item_bytes > self.size - self.pos:
            raise MlxinferError(
                f"{self.path} has a corrupt header ({n:,} {what}, more than the file can hold: a cut download?); "
                "re-download it"
            )
        return n

    def scalar(self, t: int):
        s = _STRUCTS[t]
        if s.size > self.size - self.pos:
            raise self._truncated()
        value = s.unpack_from(self.buf, self.pos)[0]
        self.pos += s.size
        return value

    def string(self) -> str:
        return self.read(self.count("string bytes", 1)).decode("utf-8", errors="replace")

    def strings(self, count: int, keep: bool = True) -> list[str] | None:
        """`count` strings in a row (each a u64 length and its bytes), with the checks string() makes."""
        buf, pos, size, out = self.buf, self.pos, self.size, []
        length, append = _U64.unpack_from, out.append
        for _ in range(count):
            if pos + 8 > size:
                self.pos = pos
                raise self._truncated()
            n = length(buf, pos)[0]
            pos += 8
            if n > size - pos:
                raise MlxinferError(
                    f"{self.path} has a corrupt header ({n:,} string bytes, more than the file can hold: a cut "
                    "download?); re-download it"
                )
            if keep:
                append(buf[pos : pos + n].decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        return out if keep else None

    def _array_head(self, depth: int) -> tuple[int, int]:
        item_type = self.scalar(4)
        if item_type == _FLOAT64:
            self.float64_keys.append(self.key)
        if depth >= MAX_NESTING or item_type not in (*_SCALARS, _STRING, _ARRAY):
            raise MlxinferError(
                f"{self.path} has a corrupt header (an array of unknown type {item_type}); {REDOWNLOAD}"
            )
        width = _STRUCTS[item_type].size if item_type in _SCALARS else 8  # a string: its length
        return item_type, self.count("array items", width)

    def skip(self, t: int, depth: int = 0) -> int:
        """Step over a value without decoding it; returns how many items it held."""
        if t == _STRING:
            self.pos += self.count("string bytes", 1)
            return 1
        if t == _ARRAY:
            item_type, count = self._array_head(depth)
            if item_type in _SCALARS:
                self.pos += _STRUCTS[item_type].size * count  # within the file: count() checked it
            elif item_type == _STRING:
                self.strings(count, keep=False)
            else:
                for _ in range(count):
                    self.skip(item_type, depth + 1)
            return count
        self.value(t)
        return 1

    def value(self, t: int, depth: int = 0):
        if t == _FLOAT64:
            self.float64_keys.append(self.key)
        if t in _SCALARS:
            return self.scalar(t)
        if t == _STRING:
            return self.string()
        if t == _ARRAY:
            item_type, count = self._array_head(depth)
            if item_type in _SCALARS:
                fmt = _SCALARS[item_type]
                return list(struct.unpack(f"<{count}{fmt[1]}", self.read(_STRUCTS[item_type].size * count)))
            if item_type == _STRING:
                return self.strings(count)
            return [self.value(item_type, depth + 1) for _ in range(count)]
        raise MlxinferError(f"{self.path} has a corrupt header (unknown value type {t}); {REDOWNLOAD}")


def read_header(path: str | Path, tokenizer: bool = True) -> GGUFHeader:
    """Parse a GGUF file's metadata and tensor table without reading tensor data.

    tokenizer=False steps over the vocabulary and merges (tens of thousands of strings)
    and records only their length under the same keys, for readers such as `count`.
    """
    path = Path(path)
    if not path.is_file():
        raise MlxinferError(f"no GGUF file at {path}; check the path")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < len(MAGIC) or f.read(len(MAGIC)) != MAGIC:
            raise MlxinferError(f"{path} is not a GGUF file (bad magic); point at a .gguf model file")
        try:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):  # a file system without memory maps: read the file
            f.seek(0)
            return _parse(f.read(), path, size, tokenizer)
        with buf:
            return _parse(buf, path, size, tokenizer)


def _parse(buf, path: Path, size: int, tokenizer: bool) -> GGUFHeader:
    r = _Reader(buf, path, size)
    r.pos = len(MAGIC)
    version = r.scalar(4)
    if version not in (2, 3):
        raise MlxinferError(
            f"{path} is GGUF version {version}; only versions 2 and 3 are supported: convert the model again "
            "with a current llama.cpp (convert_hf_to_gguf.py)"
        )
    n_tensors = r.count("tensors", 24)  # each: a name, dims, a type and an offset
    n_kv = r.count("metadata entries", 12)  # each: a key and a type
    metadata = {}
    for _ in range(n_kv):
        key = r.key = r.string()
        kind = r.scalar(4)
        if not tokenizer and key.startswith("tokenizer.ggml.") and kind == _ARRAY:
            metadata[key] = r.skip(kind)
        else:
            metadata[key] = r.value(kind)
    tensors = [_tensor_info(r, path) for _ in range(n_tensors)]
    alignment = metadata.get("general.alignment", 32)
    if type(alignment) is not int or alignment < 1 or alignment & (alignment - 1):
        raise MlxinferError(
            f"{path} has a corrupt header (general.alignment {alignment!r} is not a power of 2); {REDOWNLOAD}"
        )
    data_offset = -(-r.pos // alignment) * alignment
    header = GGUFHeader(path, version, metadata, tensors, data_offset, size, sorted(set(r.float64_keys)))
    _check_layout(header, alignment)
    return header


def _tensor_info(r: _Reader, path: Path) -> GGUFTensor:
    name = r.string()
    n_dims = r.scalar(4)
    if not 1 <= n_dims <= MAX_DIMS:
        raise MlxinferError(f"{path} has a corrupt header (tensor {name!r} has {n_dims:,} dimensions); {REDOWNLOAD}")
    dims = [r.scalar(10) for _ in range(n_dims)]
    type_id, offset = r.scalar(4), r.scalar(10)
    if type_id not in GGML_TYPES:
        raise MlxinferError(
            f"{path}: tensor {name} has unknown ggml type {type_id} (a newer llama.cpp's?); re-quantize the "
            "model with llama.cpp's llama-quantize to a K-quant such as Q4_K_M, or Q8_0"
        )
    type_name, block, block_bytes = GGML_TYPES[type_id]
    if min(dims) < 1 or max(dims) >= 2**31:  # MLX's shapes are int32
        raise MlxinferError(f"{path} has a corrupt header (tensor {name!r} has dimensions {dims}); {REDOWNLOAD}")
    if dims[0] % block:
        raise MlxinferError(
            f"{path} has a corrupt header (tensor {name!r} has dimensions {dims}, which {type_name} cannot store: "
            f"its rows of {dims[0]:,} values are no whole number of {block}-value blocks); re-download or "
            "re-quantize the file"
        )
    n = 1
    for d in dims:
        n *= d
    return GGUFTensor(name, tuple(reversed(dims)), type_name, offset, n // block * block_bytes)


def _check_layout(h: GGUFHeader, alignment: int) -> None:
    """Every tensor where the format puts it: named once, aligned, inside the file, not overlapping another."""
    end, last, names = h.data_offset, None, set()
    for t in sorted(h.tensors, key=lambda t: t.offset):
        if t.name in names:
            raise MlxinferError(f"{h.path} has a corrupt header (tensor {t.name!r} is listed twice); {REDOWNLOAD}")
        names.add(t.name)
        if t.offset % alignment:
            raise MlxinferError(
                f"{h.path} has a corrupt header (tensor {t.name!r} at offset {t.offset:,} breaks the file's "
                f"{alignment}-byte alignment); re-download it"
            )
        if last is not None and h.data_offset + t.offset < end:
            raise MlxinferError(
                f"{h.path} has a corrupt header (tensors {last!r} and {t.name!r} overlap); {REDOWNLOAD}"
            )
        end, last = h.data_offset + t.offset + t.nbytes, t.name
        if end > h.file_size:
            raise MlxinferError(
                f"{h.path} is truncated: tensor {t.name!r} ({t.type_name}, {t.nbytes:,} bytes) ends at byte "
                f"{end:,} but the file has {h.file_size:,}; re-download it"
            )


_BLOCK = re.compile(r"^blk\.(\d+)\.")


def config_from_header(header: GGUFHeader) -> ModelConfig:
    """Translate GGUF metadata into the fields config.json would have. The keys are the same for every
    architecture, under its llama.cpp name (`llama.block_count`); which names load: architectures.py."""
    m, arch = header.metadata, header.architecture
    if arch not in GGUF:
        raise MlxinferError(
            f"{header.path}: unknown architecture '{arch}' for a GGUF file (GGUF files load for "
            f"{', '.join(sorted(GGUF))}); load the model's safetensors checkpoint instead, which runs on "
            "mlx-lm's class for it"
        )

    def get(key: str, default=None):
        return m.get(f"{arch}.{key}", default)

    names = {t.name for t in header.tensors}
    embed = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    tokens = m.get("tokenizer.ggml.tokens", [])  # a count when read with tokenizer=False
    n_tokens = len(tokens) if isinstance(tokens, list) else tokens if type(tokens) is int else 0
    vocab = get("vocab_size") or n_tokens or (embed.shape[0] if embed else None)
    heads = get("attention.head_count")
    d = {field: get(key) for field, key in GGUF_KEYS.items()}
    d.update(
        model_type=GGUF[arch],
        vocab_size=vocab,
        num_key_value_heads=get("attention.head_count_kv", heads),
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-6),
        rope_theta=get("rope.freq_base", 10000.0),
        tie_word_embeddings="output.weight" not in names,
        torch_dtype="float16" if embed is None or embed.type_name != "F32" else "float32",
    )
    if not d["head_dim"]:  # llama.cpp's rule without key_length: n_embd / n_head (not Hugging Face's default)
        whole = is_whole(d["hidden_size"]) and is_whole(heads) and heads > 0
        if whole and d["hidden_size"] % heads:
            raise MlxinferError(  # (with no key_length to say the heads' width)
                f"{header.path}: {arch}.embedding_length {d['hidden_size']} is not divisible by "
                f"{arch}.attention.head_count {heads}; {METADATA_FIX}"
            )
        d["head_dim"] = d["hidden_size"] // heads if whole else None
        if d["head_dim"] is None:
            del d["head_dim"]
    missing = [f"{arch}.{GGUF_KEYS.get(k, k)}" for k, v in d.items() if v is None]
    if missing:
        raise MlxinferError(f"{header.path}: GGUF metadata lacks {', '.join(missing)}; the file is incomplete")
    rows = embed.shape[0] if embed is not None and embed.shape else None
    # more tokens than rows: a prompt's token past them has no embedding (was: read out of bounds). Fewer is a
    # padded table, as Qwen's checkpoints keep it: the rows past the tokenizer stay scored, as in mlx-lm
    if n_tokens and rows and n_tokens > rows:
        raise MlxinferError(
            f"{header.path}: tokenizer.ggml.tokens holds {n_tokens:,} tokens but token_embd.weight has only {rows:,} "
            f"rows; {METADATA_FIX}"
        )
    if isinstance(d["hidden_size"], int) and isinstance(heads, int) and heads > 0:
        head_dim, base = d.get("head_dim") or d["hidden_size"] // heads, d["rope_theta"]
        rotated = get("rope.dimension_count")
        if rotated is not None and rotated != head_dim:  # was: ignored, every dimension rotated
            raise MlxinferError(
                f"{header.path}: {arch}.rope.dimension_count is {rotated} where the heads are {head_dim} wide; a "
                f"partial rotary embedding is not supported for {arch} (llama.cpp refuses it too); {METADATA_FIX}"
            )
        if is_whole(head_dim) and head_dim > 0 and is_number(base) and base > 0:  # else from_dict names the key
            scaling = rope_scaling(header, arch, head_dim, base)
            if scaling:
                d["rope_scaling"] = scaling
    check_blocks(header, d["num_hidden_layers"], f"{arch}.block_count")
    try:
        return ModelConfig.from_dict(d, where=str(header.path), fix=METADATA_FIX)
    except MlxinferError as e:  # said in the file's own keys, which is what a reader of it can look up
        where, said = str(header.path), str(e)
        head = where if said.startswith(where) else ""
        told = said[len(head) :].replace("add an explicit head_dim", METADATA_FIX)
        told = _FIELD.sub(lambda f: f"{arch}.{GGUF_KEYS[f.group(0)]}", told)
        raise MlxinferError(head + told, *e.params) from None


# llama.cpp's tensor names -> Hugging Face's: one map for every architecture a GGUF file of loads
_GGUF_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def gguf_to_hf(name: str) -> str:
    m = re.match(r"^blk\.(\d+)\.(\w+)\.(\w+)$", name)
    if m:
        layer, module, part = m.groups()
        if module in _GGUF_NAMES and not _GGUF_NAMES[module].startswith(("model.", "lm_head")):
            return f"model.layers.{layer}.{_GGUF_NAMES[module]}.{part}"
    else:
        module, _, part = name.partition(".")
        if module in _GGUF_NAMES and _GGUF_NAMES[module].startswith(("model.", "lm_head")):
            return f"{_GGUF_NAMES[module]}.{part}"
    raise MlxinferError(
        f"GGUF tensor '{name}' has no place in a supported model; the file is not a plain decoder", "source"
    )


def check_blocks(header: GGUFHeader, n_layers, key: str) -> None:
    """The metadata's layer count against the tensors present (blk.0 to blk.N-1, none missing, none beyond),
    before anything is built from it."""
    present = {int(m.group(1)) for t in header.tensors if (m := _BLOCK.match(t.name))}
    exact = len(present) == n_layers and min(present, default=0) == 0 and max(present, default=-1) == n_layers - 1
    if is_whole(n_layers) and n_layers > 0 and not exact:  # (distinct ids: n of them from 0 to n - 1 are those)
        held = f"blk.{min(present)} to blk.{max(present)}" if present else "none"
        raise MlxinferError(
            f"{header.path}: {key} says {n_layers:,} layers but the file holds tensors for {len(present):,} "
            f"({held}); the file is corrupt or incomplete: re-download or re-convert it"
        )
