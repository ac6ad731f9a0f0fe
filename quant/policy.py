"""Which modules get which (bits, group size): the global setting plus overrides for the vocabulary tables.

No mlx here. Module paths are Hugging Face's (`model.embed_tokens`, `model.layers.0.self_attn.q_proj`,
`lm_head`), as config.json's `quantization` block keys them.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxinfer.errors import MlxinferError, is_whole
from mlxinfer.formats.config import QUANT_BITS, QUANT_GROUPS

VALID_BITS = QUANT_BITS  # what mx.quantize's affine mode packs (formats/config.py states it once)
VALID_GROUP_SIZES = QUANT_GROUPS
FLOAT_BITS = 16  # "no quantization": the weights stay in the float dtype
EMBED, HEAD = "model.embed_tokens", "lm_head"


def check_bits(bits: int, option: str = "bits", allow_float: bool = True) -> int:
    allowed = VALID_BITS + ((FLOAT_BITS,) if allow_float else ())
    if not is_whole(bits) or bits not in allowed:
        extra = f" (or {FLOAT_BITS}: no quantization)" if allow_float else ""
        raise MlxinferError(
            f"{option} {bits} is not supported; use one of {', '.join(map(str, VALID_BITS))}{extra}", option
        )
    return bits


def check_group_size(group_size: int) -> int:
    if isinstance(group_size, bool) or group_size not in VALID_GROUP_SIZES:
        raise MlxinferError(
            f"group_size {group_size} is not supported; use one of {', '.join(map(str, VALID_GROUP_SIZES))}",
            "group_size",
        )
    return group_size


@dataclass(frozen=True)
class Policy:
    """bits/group_size for every Linear and Embedding; head_bits/embed_bits override the vocabulary tables.

    head_bits applies to the output table (`lm_head`; the shared embedding table when the model ties
    them), embed_bits to the input embedding table. None: the global bits; 16: left in float.
    """

    bits: int = 4
    group_size: int = 64
    head_bits: int | None = None
    embed_bits: int | None = None

    def __post_init__(self):
        check_bits(self.bits)
        check_group_size(self.group_size)
        for option, value in (("head_bits", self.head_bits), ("embed_bits", self.embed_bits)):
            if value is None:
                continue
            check_bits(value, option)
            if self.bits == FLOAT_BITS and value != FLOAT_BITS:
                raise MlxinferError(
                    f"{option} {value} needs a quantized model; bits is {FLOAT_BITS} (float)", option, "bits"
                )

    @property
    def quantized(self) -> bool:
        return self.bits != FLOAT_BITS

    def bits_for(self, module: str, tied: bool) -> int:
        """Bits for one module (Hugging Face path); FLOAT_BITS means left in float."""
        if (
            tied
            and module == EMBED
            and None not in (self.head_bits, self.embed_bits)
            and self.head_bits != self.embed_bits
        ):
            raise MlxinferError(
                f"this model ties its embedding and output tables (one table), but head_bits {self.head_bits} "
                f"and embed_bits {self.embed_bits} differ; give one of them",
                "head_bits",
                "embed_bits",
            )
        if module == HEAD or (tied and module == EMBED and self.head_bits is not None):
            return self.head_bits if self.head_bits is not None else self.bits
        if module == EMBED and self.embed_bits is not None:
            return self.embed_bits
        return self.bits

    def settings(self, modules: dict[str, int], tied: bool) -> dict[str, tuple[int, int] | None]:
        """{module: (group_size, bits) or None (float)} for modules {hf path: input size}; checks the groups."""
        out = {}
        for name in modules:
            bits = self.bits_for(name, tied)
            out[name] = None if bits == FLOAT_BITS else (self.group_size, bits)
        check_divides(out, modules)
        return out

    def describe(self, tied: bool = False) -> str:
        if not self.quantized:
            return "float"
        parts = [f"{self.bits}-bit, group {self.group_size}"]
        if tied:
            shared = self.head_bits if self.head_bits is not None else self.embed_bits
            labels = (("embedding/output table (tied)", shared),)
        else:
            labels = (("embedding table", self.embed_bits), ("output table", self.head_bits))
        for label, value in labels:
            if value is not None and value != self.bits:
                parts.append(f"{label} " + ("in float" if value == FLOAT_BITS else f"{value}-bit"))
        return "; ".join(parts)


def check_divides(settings: dict[str, tuple[int, int] | None], modules: dict[str, int]) -> None:
    """A group must not straddle rows: the group size divides every quantized layer's input size."""
    for name, setting in settings.items():
        if setting is None:
            continue
        group_size, n = setting[0], modules[name]
        if n % group_size:
            fits = [g for g in VALID_GROUP_SIZES if n % g == 0]
            hint = f"use group_size {' or '.join(map(str, fits))}" if fits else "no supported group size fits it"
            raise MlxinferError(
                f"group size {group_size} does not divide the input size {n} of layer {name}; {hint}", "group_size"
            )


def config_block(settings: dict[str, tuple[int, int] | None], default: tuple[int, int] | None = None) -> dict | None:
    """config.json's `quantization` block: `default` (else the most common setting) globally, an override
    for every module that differs. None when nothing is quantized."""
    counts: dict[tuple[int, int], int] = {}
    for s in settings.values():
        if s is not None:
            counts[s] = counts.get(s, 0) + 1
    if not counts:
        return None
    group_size, bits = default or max(counts, key=lambda s: (counts[s], -s[1]))
    block: dict = {"group_size": group_size, "bits": bits, "mode": "affine"}
    for name, s in settings.items():
        if s is None:
            block[name] = False
        elif s != (group_size, bits):
            block[name] = {"group_size": s[0], "bits": s[1]}
    return block
