"""GGUF files: the header (metadata and tensor table) in plain Python, and the
config it describes.

Reading the header needs no mlx, so `count` can use it; the tensors themselves
are read by `mx.load` in weights.py.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from ..errors import MlxinferError
from .config import ModelConfig

MAGIC = b"GGUF"

# ggml tensor types: name, elements per block, bytes per block
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    30: ("BF16", 1, 2),
}
# the types mx.load reads (quantized ones arrive as MLX affine weights, group 32)
LOADABLE = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q8_0"}

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


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

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))


class _Reader:
    def __init__(self, f: BinaryIO, path: Path, size: int):
        self.f, self.path, self.size = f, path, size

    def read(self, n: int) -> bytes:
        b = self.f.read(n)
        if len(b) != n:
            raise MlxinferError(f"{self.path} is truncated (its header ends early); re-download the file")
        return b

    def scalar(self, t: int):
        fmt = _SCALARS[t]
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        n = self.scalar(10)
        if n > self.size:
            raise MlxinferError(f"{self.path} has a corrupt header (a string longer than the file)")
        return self.read(n).decode("utf-8", errors="replace")

    def skip(self, t: int) -> int:
        """Step over a value without decoding it; returns how many items it held."""
        if t == _STRING:
            n = self.scalar(10)
            self.f.seek(n, 1)
            return 1
        if t == _ARRAY:
            item_type, count = self.scalar(4), self.scalar(10)
            if item_type in _SCALARS:
                self.f.seek(struct.calcsize(_SCALARS[item_type]) * count, 1)
            else:
                for _ in range(count):
                    self.skip(item_type)
            return count
        self.scalar(t)
        return 1

    def value(self, t: int):
        if t in _SCALARS:
            return self.scalar(t)
        if t == _STRING:
            return self.string()
        if t == _ARRAY:
            item_type, count = self.scalar(4), self.scalar(10)
            if count > self.size:
                raise MlxinferError(f"{self.path} has a corrupt header (an array longer than the file)")
            if item_type in _SCALARS:
                fmt = _SCALARS[item_type]
                width = struct.calcsize(fmt)
                return list(struct.unpack(f"<{count}{fmt[1]}", self.read(width * count)))
            return [self.value(item_type) for _ in range(count)]
        raise MlxinferError(f"{self.path} has a corrupt header (unknown value type {t})")


def read_header(path: str | Path, tokenizer: bool = True) -> GGUFHeader:
    """Parse a GGUF file's metadata and tensor table without reading tensor data.

    tokenizer=False steps over the vocabulary and merges (tens of thousands of strings)
    and records only their length under the same keys, for readers such as `count`.
    """
    path = Path(path)
    if not path.is_file():
        raise MlxinferError(f"no GGUF file at {path}; check the path")
    size = path.stat().st_size
    with open(path, "rb") as f:
        r = _Reader(f, path, size)
        if f.read(4) != MAGIC:
            raise MlxinferError(f"{path} is not a GGUF file (bad magic); point at a .gguf model file")
        version = r.scalar(4)
        if version not in (2, 3):
            raise MlxinferError(f"{path} is GGUF version {version}; only versions 2 and 3 are supported")
        n_tensors, n_kv = r.scalar(10), r.scalar(10)
        metadata = {}
        for _ in range(n_kv):
            key = r.string()
            kind = r.scalar(4)
            if not tokenizer and key.startswith("tokenizer.ggml.") and kind == _ARRAY:
                metadata[key] = r.skip(kind)
            else:
                metadata[key] = r.value(kind)
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.scalar(4)
            dims = [r.scalar(10) for _ in range(n_dims)]
            type_id, offset = r.scalar(4), r.scalar(10)
            if type_id not in GGML_TYPES:
                raise MlxinferError(f"{path}: tensor {name} has unknown ggml type {type_id}")
            type_name, block, block_bytes = GGML_TYPES[type_id]
            n = 1
            for d in dims:
                n *= d
            tensors.append(GGUFTensor(name, tuple(reversed(dims)), type_name, offset, n // block * block_bytes))
        alignment = int(metadata.get("general.alignment", 32))
        data_offset = -(-f.tell() // alignment) * alignment
    header = GGUFHeader(path, version, metadata, tensors, data_offset, size)
    end = max((data_offset + t.offset + t.nbytes for t in tensors), default=data_offset)
    if end > size:
        raise MlxinferError(
            f"{path} is truncated: its tensors need {end:,} bytes but the file has {size:,}; re-download it"
        )
    return header


# GGUF architecture -> our model_type
_ARCH = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


def config_from_header(header: GGUFHeader) -> ModelConfig:
    """Translate GGUF metadata into the fields config.json would have."""
    m, arch = header.metadata, header.architecture
    if arch not in _ARCH:
        raise MlxinferError(f"{header.path}: unknown architecture '{arch}'; supported: {', '.join(sorted(_ARCH))}")

    def get(key: str, default=None):
        return m.get(f"{arch}.{key}", default)

    names = {t.name for t in header.tensors}
    embed = next((t for t in header.tensors if t.name == "token_embd.weight"), None)
    tokens = m.get("tokenizer.ggml.tokens", [])  # a count when read with tokenizer=False
    n_tokens = tokens if isinstance(tokens, int) else len(tokens)
    vocab = get("vocab_size") or n_tokens or (embed.shape[0] if embed else None)
    heads = get("attention.head_count")
    d = {
        "model_type": _ARCH[arch],
        "vocab_size": vocab,
        "hidden_size": get("embedding_length"),
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("attention.head_count_kv", heads),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": get("rope.freq_base", 10000.0),
        "max_position_embeddings": get("context_length"),
        "tie_word_embeddings": "output.weight" not in names,
        "torch_dtype": "float16" if embed is None or embed.type_name != "F32" else "float32",
    }
    if get("attention.key_length"):
        d["head_dim"] = get("attention.key_length")
    if "rope_freqs.weight" in names:
        raise MlxinferError(
            f"{header.path}: stores custom RoPE frequencies (rope_freqs.weight), which this loader does not apply;"
            " use the model's safetensors checkpoint"
        )
    missing = [k for k, v in d.items() if v is None]
    if missing:
        raise MlxinferError(f"{header.path}: GGUF metadata lacks {', '.join(missing)}; the file is incomplete")
    return ModelConfig.from_dict(d, where=str(header.path))
