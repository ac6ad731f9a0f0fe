"""Hostile model files, written byte by byte so that a test (or the fuzzer) controls every field.

`GGUFSpec` holds a GGUF file as data: metadata (key, value type, value) and tensors (name, ggml dims,
type, offset, bytes). `to_bytes` lays it out exactly as written, even when the fields contradict each
other (offsets out of order, dims that disagree with the data, a bad alignment), which is the point.
`tiny_gguf` is a small valid llama in that form, from a tiny Hugging Face checkpoint.
"""

from __future__ import annotations

import json
import struct
from copy import deepcopy
from dataclasses import dataclass, field
from pathlib import Path

import checkpoints
import numpy as np

# GGUF metadata value types; RAW: the value is the bytes after the key (type field included), as given
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
RAW = -1
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?"}
_FMT |= {U64: "<Q", I64: "<q", F64: "<d"}
# ggml tensor types used here: id, elements per block, bytes per block
GGML = {"F32": (0, 1, 4), "F16": (1, 1, 2), "Q4_0": (2, 32, 18), "Q4_1": (3, 32, 20), "Q8_0": (8, 32, 34)}


@dataclass
class Tensor:
    name: str
    dims: list[int]  # ggml order: the row length first
    type_id: int
    data: bytes
    offset: int | None = None  # None: laid out after the previous one, aligned


@dataclass
class GGUFSpec:
    metadata: list[tuple[str, int, object]] = field(default_factory=list)  # (key, type, value); arrays: (item, list)
    tensors: list[Tensor] = field(default_factory=list)
    alignment: int = 32  # how to lay the data out (general.alignment in metadata is what the reader is told)
    version: int = 3

    def copy(self) -> "GGUFSpec":
        return deepcopy(self)

    def meta(self, key: str):
        return next((v for k, _, v in self.metadata if k == key), None)

    def set_meta(self, key: str, kind: int, value) -> None:
        self.metadata = [m for m in self.metadata if m[0] != key] + [(key, kind, value)]

    def drop_meta(self, key: str) -> None:
        self.metadata = [m for m in self.metadata if m[0] != key]

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)

    def offsets(self) -> list[int]:
        """Each tensor's offset in the data section: as set, or after the previous one, aligned."""
        offsets, at = [], 0
        for t in self.tensors:
            at = -(-at // self.alignment) * self.alignment
            offsets.append(at if t.offset is None else t.offset)
            at = max(at, offsets[-1]) + len(t.data)
        return offsets

    def to_bytes(self) -> bytes:
        out = bytearray(b"GGUF" + struct.pack("<IQQ", self.version, len(self.tensors), len(self.metadata)))
        for key, kind, value in self.metadata:
            out += _string(key) + (value if kind == RAW else struct.pack("<I", kind) + _value(kind, value))
        offsets = self.offsets()
        for t, offset in zip(self.tensors, offsets):
            out += _string(t.name) + struct.pack("<I", len(t.dims)) + b"".join(struct.pack("<Q", d) for d in t.dims)
            out += struct.pack("<IQ", t.type_id, offset % 2**64)
        start = -(-len(out) // self.alignment) * self.alignment
        self.header_size = start
        data = bytearray()
        for t, offset in zip(self.tensors, offsets):
            end = offset + len(t.data)
            if end > 1 << 30:
                continue  # an offset far past the end: the header claims bytes the file does not have
            if len(data) < end:
                data += bytes(end - len(data))
            data[offset:end] = t.data
        return bytes(out) + bytes(start - len(out)) + bytes(data)

    def write(self, path: Path) -> Path:
        Path(path).write_bytes(self.to_bytes())
        return Path(path)


def _string(s: str | bytes) -> bytes:
    b = s.encode("utf-8", "surrogatepass") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def _value(kind: int, value) -> bytes:
    if kind == STRING:
        return _string(value)
    if kind == ARRAY:
        item, items = value
        return struct.pack("<IQ", item, len(items)) + b"".join(_value(item, v) for v in items)
    return struct.pack(_FMT[kind], value)


def tensor(name: str, values: np.ndarray, kind: str = "F32") -> Tensor:
    """A tensor from (rows, cols) float values, stored as `kind` (quantized by gguf-py)."""
    import gguf

    type_id = GGML[kind][0]
    if kind == "F32":
        data = values.astype(np.float32).tobytes()
    elif kind == "F16":
        data = values.astype(np.float16).tobytes()
    else:
        data = gguf.quants.quantize(values.astype(np.float32), gguf.GGMLQuantizationType[kind]).tobytes()
    return Tensor(name, list(reversed(values.shape)), type_id, data)


def tiny_gguf(hf_dir: Path, kind: str = "Q8_0") -> GGUFSpec:
    """The tiny llama checkpoint in `hf_dir` as a GGUF spec: matrices stored as `kind`, norms F32, its
    tokenizer and chat template in metadata (q/k rows left as they are: the values do not matter here)."""
    import mlx.core as mx

    cfg = json.loads((hf_dir / "config.json").read_text())
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    tokens = [t for t, _ in sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])]
    specials = {t["content"] for t in tok["added_tokens"] if t["special"]}
    merges = [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]
    a = "llama."
    spec = GGUFSpec(
        metadata=[
            ("general.architecture", STRING, "llama"),
            ("general.alignment", U32, 32),
            (a + "block_count", U32, cfg["num_hidden_layers"]),
            (a + "context_length", U32, cfg["max_position_embeddings"]),
            (a + "embedding_length", U32, cfg["hidden_size"]),
            (a + "feed_forward_length", U32, cfg["intermediate_size"]),
            (a + "attention.head_count", U32, cfg["num_attention_heads"]),
            (a + "attention.head_count_kv", U32, cfg["num_key_value_heads"]),
            (a + "attention.layer_norm_rms_epsilon", F32, cfg["rms_norm_eps"]),
            (a + "rope.freq_base", F32, cfg["rope_theta"]),
            (a + "vocab_size", U32, cfg["vocab_size"]),
            ("tokenizer.ggml.model", STRING, "gpt2"),
            ("tokenizer.ggml.pre", STRING, "gpt-2"),
            ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
            ("tokenizer.ggml.token_type", ARRAY, (I32, [3 if t in specials else 1 for t in tokens])),
            ("tokenizer.ggml.merges", ARRAY, (STRING, merges)),
            ("tokenizer.ggml.eos_token_id", U32, tokens.index("<|im_end|>")),
            (
                "tokenizer.chat_template",
                STRING,
                json.loads((hf_dir / "tokenizer_config.json").read_text())["chat_template"],
            ),
        ]
    )
    weights = {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(hf_dir / "model.safetensors")).items()}
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    top["lm_head.weight"] = "output.weight"
    for name, value in sorted(weights.items()):
        if name in top:
            gname = top[name]
        else:
            _, _, layer, rest = name.split(".", 3)
            gname = f"blk.{layer}.{checkpoints.GGUF_PARTS[rest.rsplit('.', 1)[0]]}.weight"
        spec.tensors.append(tensor(gname, value, kind if value.ndim == 2 else "F32"))
    return spec


def read_safetensors(path: Path) -> tuple[dict, bytes]:
    """A safetensors file's JSON header and its data bytes."""
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_safetensors(path: Path, header: dict, data: bytes) -> Path:
    """Write `header` (any JSON, consistent or not) and `data` as a safetensors file."""
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + data)
    return Path(path)
