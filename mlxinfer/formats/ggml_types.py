"""ggml's tensor types and llama.cpp's file types, as plain tables (no numpy, no gguf: `count` reads them).

GGML_TYPES: every type id a GGUF tensor may carry -> (name, values per block, bytes per block), from
ggml's type traits (the `gguf` package's GGML_QUANT_SIZES agrees on all of them but Q8_1, an activation
type no file stores, where ggml's block_q8_1 is 36 bytes). FILE_TYPES: `general.file_type` -> the name
llama.cpp's loader prints ("Q4_K - Medium"); `file_type` guesses it as llama.cpp does when the key is
missing. LOADS_AS: how mlxinfer keeps each type in MLX (model/gguf_tensors.py says why).
"""

from __future__ import annotations

import re

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
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}

BY_NAME: dict[str, tuple[int, int]] = {name: (block, nbytes) for name, block, nbytes in GGML_TYPES.values()}

# type -> (MLX affine bits, group 32, exact): exact where the block's grid is an MLX group's (codes, scale
# and bias taken from the block), else the float32 values re-fit to 8 bits; F32/F16/BF16 stay as stored
EXACT_BITS = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q8_0": 8, "IQ4_NL": 8, "IQ4_XS": 8}
REFIT = {"Q2_K", "Q3_K", "Q6_K", "IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "TQ1_0", "TQ2_0"}
REFIT |= {"MXFP4", "NVFP4"}
REFIT_BITS = 8
FLOATS = ("F32", "F16", "BF16")
# a quantized GGUF type or llama-quantize's file type as a user types it: Q4_K_M, q8_0, IQ4_XS (not f16 or bf16:
# names a folder of float weights may well have)
QUANT_NAME = re.compile(r"(?i)I?Q\d(_[0-9KSMLXN]+)+")


def loads_as(type_name: str) -> str:
    """'exact 4-bit g32', 're-fit 8-bit g32', 'as stored' or 'not loaded' (a type no model file holds)."""
    if type_name in FLOATS:
        return "as stored"
    if type_name in EXACT_BITS:
        return f"exact {EXACT_BITS[type_name]}-bit g32"
    return f"re-fit {REFIT_BITS}-bit g32" if type_name in REFIT else "not loaded"


# llama_ftype -> llama_model_ftype_name's text
FILE_TYPES: dict[int, str] = {
    0: "all F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K - Medium",
    11: "Q3_K - Small",
    12: "Q3_K - Medium",
    13: "Q3_K - Large",
    14: "Q4_K - Small",
    15: "Q4_K - Medium",
    16: "Q5_K - Small",
    17: "Q5_K - Medium",
    18: "Q6_K",
    19: "IQ2_XXS - 2.0625 bpw",
    20: "IQ2_XS - 2.3125 bpw",
    21: "Q2_K - Small",
    22: "IQ3_XS - 3.3 bpw",
    23: "IQ3_XXS - 3.0625 bpw",
    24: "IQ1_S - 1.5625 bpw",
    25: "IQ4_NL - 4.5 bpw",
    26: "IQ3_S - 3.4375 bpw",
    27: "IQ3_S mix - 3.66 bpw",
    28: "IQ2_S - 2.5 bpw",
    29: "IQ2_M - 2.7 bpw",
    30: "IQ4_XS - 4.25 bpw",
    31: "IQ1_M - 1.75 bpw",
    32: "BF16",
    36: "TQ1_0 - 1.69 bpw ternary",
    37: "TQ2_0 - 2.06 bpw ternary",
    38: "MXFP4 MoE",
    39: "NVFP4",
}

# the file type llama.cpp's loader guesses from a file's most common tensor type
_GUESS = {
    "F32": 0, "F16": 1, "BF16": 32, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q8_0": 7, "Q2_K": 10,
    "Q3_K": 12, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "TQ1_0": 36, "TQ2_0": 37, "IQ2_XXS": 19, "IQ2_XS": 20,
    "IQ2_S": 28, "IQ3_XXS": 23, "IQ1_S": 24, "IQ1_M": 31, "IQ4_NL": 25, "IQ4_XS": 30, "IQ3_S": 26, "NVFP4": 39,
}  # fmt: skip


def file_type(metadata: dict, tensor_types: dict[str, str]) -> tuple[int | None, str]:
    """(general.file_type or None, llama.cpp's name for it). Without the key, llama.cpp's guess: the type
    most tensors have (the first to reach the largest count, tensors taken by name), "(guessed)"."""
    value = metadata.get("general.file_type")
    if type(value) is int:
        return value, FILE_TYPES.get(value, "unknown, may not work")
    counts: dict[str, int] = {}
    most, top = "F32", 0
    for name in sorted(tensor_types):
        kind = tensor_types[name]
        counts[kind] = counts.get(kind, 0) + 1
        if counts[kind] > top:
            most, top = kind, counts[kind]
    return None, FILE_TYPES[_GUESS.get(most, 0)] + " (guessed)"
