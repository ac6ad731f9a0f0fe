"""Hypothesis strategies for hostile input: mutations of GGUF headers, safetensors headers and
config.json values, JSON Schemas, and command-line option values.

A strategy draws a *case*: plain data (a kind, a list of mutations or an argument list) that
runner.py turns into files and one `python -m mlxinfer ...` subprocess. The mutations are kept as
data so that a failure can be printed, stored and replayed.
"""

from __future__ import annotations

import hostile
from hypothesis import strategies as st

# ---------------------------------------------------------------------------------------------- values
EDGE_INTS = [0, 1, -1, 2, 3, 31, 32, 33, 64, 127, 128, 255, 256, 4096, 2**31 - 1, 2**31, 2**32, 2**53 + 1]
EDGE_INTS += [2**63 - 1, 2**63, 2**64 - 1, 10**9, 10**30, -(2**63)]
weird_ints = st.one_of(st.integers(-4, 300), st.sampled_from(EDGE_INTS), st.integers(-(2**70), 2**70))
weird_floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-300, 5e-324, 1e300, 0.5, 1.5, float("nan"), float("inf"), -float("inf")]),
)
short_text = st.text(max_size=12)
json_scalars = st.one_of(st.none(), st.booleans(), weird_ints, weird_floats, short_text)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(short_text, inner, max_size=4)),
    max_leaves=8,
)
# what a user might type where a number goes
NUMBER_WORDS = ["nan", "NaN", "inf", "-inf", "Infinity", "1e999", "-1e999", "-0", "0", "", " ", "0x10", "1_000"]
NUMBER_WORDS += ["½", "٣", "1,2", ",", "0.5,,1", "1e-400", "9" * 40, "-" + "9" * 40, "1.5", "-1", "2:1", "0:0"]
NUMBER_WORDS += ["1e-45", "1e-300", "5e-324", "1e-7", "1e-6", "3.4e38", "1e38", "1e-45,1", "0,1e300", "0.999999"]
plausible_number = st.one_of(
    st.integers(-3, 600).map(str),
    st.floats(-2.5, 3.5).map(lambda x: f"{x:.3g}"),
    st.sampled_from(["0", "1", "0.5,1,1.5"]),
)
number_text = st.one_of(
    plausible_number,
    plausible_number,
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(NUMBER_WORDS),
    st.text(max_size=6),
)
SPECIAL_TEXT = ["<|im_end|>", "<|im_start|>system\n", "<|endoftext|>", "<think>", "</think>", "<|eot_id|>"]
SPECIAL_TEXT += ["{{ raise_exception('x') }}", "{% for x in y %}", "\x00", "\r\n", "\u202e", "🍅" * 50, "\ufeff"]
prompt_text = st.one_of(
    st.text(max_size=40),
    st.lists(st.sampled_from(SPECIAL_TEXT) | st.text(max_size=5), max_size=6).map("".join),
    st.just("x " * 700),  # longer than the tiny model's context
)

# ---------------------------------------------------------------------------------------------- GGUF
_PACKABLE = {
    hostile.U8: st.integers(0, 2**8 - 1),
    hostile.I8: st.integers(-(2**7), 2**7 - 1),
    hostile.U16: st.integers(0, 2**16 - 1),
    hostile.I16: st.integers(-(2**15), 2**15 - 1),
    hostile.U32: st.integers(0, 2**32 - 1) | st.sampled_from([0, 1, 3, 32, 10**9, 2**32 - 1]),
    hostile.I32: st.integers(-(2**31), 2**31 - 1),
    hostile.U64: st.integers(0, 2**64 - 1) | st.sampled_from([0, 1, 2**63, 2**64 - 1]),
    hostile.I64: st.integers(-(2**63), 2**63 - 1),
    hostile.F32: weird_floats.filter(lambda x: abs(x) < 3e38 or x != x or abs(x) == float("inf")),
    hostile.F64: weird_floats,
    hostile.BOOL: st.booleans(),
    hostile.STRING: st.text(max_size=20),
}
gguf_typed_value = st.one_of(
    *(st.tuples(st.just(kind), values) for kind, values in _PACKABLE.items()),
    st.tuples(st.just(hostile.ARRAY), st.tuples(st.just(hostile.U32), st.lists(_PACKABLE[hostile.U32], max_size=5))),
    st.tuples(st.just(hostile.ARRAY), st.tuples(st.just(hostile.STRING), st.lists(st.text(max_size=6), max_size=5))),
    st.tuples(st.just(hostile.RAW), st.binary(max_size=24)),
)
weird_dim = st.one_of(st.integers(0, 600), st.sampled_from([0, 1, 32, 128, 256, 384, 2**31, 2**32, 2**63, 2**64 - 1]))


def gguf_mutations(meta_keys: list[str], n_tensors: int):
    """A list of mutations of a GGUFSpec (see runner.mutate_gguf)."""
    tensor = st.integers(0, n_tensors - 1)
    op = st.one_of(
        st.tuples(st.just("meta"), st.sampled_from(meta_keys) | short_text, gguf_typed_value),
        st.tuples(st.just("drop"), st.sampled_from(meta_keys)),
        st.tuples(st.just("dims"), tensor, st.lists(weird_dim, max_size=5)),
        st.tuples(st.just("swap"), tensor),
        st.tuples(st.just("type"), tensor, st.integers(0, 40)),
        st.tuples(st.just("offset"), tensor, st.integers(-64, 64) | st.sampled_from([2**62, 2**64 - 1, 1, 31])),
        st.tuples(st.just("name"), tensor, short_text | st.sampled_from(["token_embd.weight", "blk.9.attn_q.weight"])),
        st.tuples(st.just("fill"), tensor, st.sampled_from([b"\xff", b"\x00", b"\x7f", b"\x7c\x00"])),
        st.tuples(st.just("version"), st.integers(0, 2**32 - 1)),
    )
    byte_op = st.one_of(
        st.tuples(st.just("flip"), st.floats(0, 1), st.integers(0, 255)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
    )
    return st.tuples(st.lists(op, min_size=1, max_size=3), st.lists(byte_op, max_size=2))


# ---------------------------------------------------------------------------------------------- safetensors
ST_DTYPES = ["F32", "F16", "BF16", "U32", "U8", "I64", "F64", "BOOL", "F8_E5M2", "X99", "", "f32", "F4"]


def safetensors_mutations(names: list[str]):
    entry = st.sampled_from(names)
    op = st.one_of(
        st.tuples(st.just("dtype"), entry, st.sampled_from(ST_DTYPES) | json_values),
        st.tuples(st.just("shape"), entry, st.lists(weird_ints, max_size=4) | json_values),
        st.tuples(st.just("offsets"), entry, st.lists(weird_ints, min_size=2, max_size=2) | json_values),
        st.tuples(st.just("drop"), entry),
        st.tuples(st.just("rename"), entry, short_text),
        st.tuples(st.just("entry"), entry, json_values),
        st.tuples(st.just("metadata"), json_values),
    )
    byte_op = st.one_of(
        st.tuples(st.just("flip"), st.floats(0, 1), st.integers(0, 255)),
        st.tuples(st.just("length"), st.sampled_from([0, 1, 7, 2**32, 2**63, 2**64 - 1]) | st.integers(0, 5000)),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
    )
    return st.tuples(
        st.sampled_from(["bf16", "4bit"]), st.lists(op, min_size=1, max_size=3), st.lists(byte_op, max_size=1)
    )


# ---------------------------------------------------------------------------------------------- config.json
CONFIG_KEYS = ["model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"]
CONFIG_KEYS += ["num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta"]
CONFIG_KEYS += ["rope_scaling", "max_position_embeddings", "tie_word_embeddings", "torch_dtype", "quantization"]
CONFIG_KEYS += ["attention_bias", "mlp_bias", "quantization_config"]
quant_block = st.fixed_dictionaries(
    {
        "bits": st.sampled_from([1, 2, 4, 8, 7, 0]) | json_values,
        "group_size": st.sampled_from([32, 64, 0, 7]) | json_values,
    },
    optional={"model.embed_tokens": json_values, "lm_head": st.booleans() | json_values, "mode": short_text},
)
rope_block = st.fixed_dictionaries(
    {"rope_type": st.sampled_from(["llama3", "linear", "default", "yarn"]) | json_values},
    optional={k: weird_floats | weird_ints for k in ("factor", "low_freq_factor", "high_freq_factor")},
)
config_value = st.one_of(json_values, quant_block, rope_block, weird_ints, weird_floats)
config_mutations = st.tuples(
    st.lists(
        st.one_of(
            st.tuples(st.just("set"), st.sampled_from(CONFIG_KEYS) | short_text, config_value),
            st.tuples(st.just("drop"), st.sampled_from(CONFIG_KEYS)),
            st.tuples(st.just("file"), st.sampled_from(["config.json", "generation_config.json"]), json_values),
            st.tuples(st.just("text"), st.sampled_from(["config.json", "tokenizer_config.json"]), st.text(max_size=30)),
            st.tuples(st.just("template"), st.text(max_size=30) | st.sampled_from(SPECIAL_TEXT)),
        ),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from(["count", "topk"]),
)

# ---------------------------------------------------------------------------------------------- JSON Schemas
_schema_leaf = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["string", "integer", "number", "boolean", "null", "array", "object", "x"])
        | json_values,
        "enum": st.lists(json_scalars, max_size=3),
        "const": json_scalars,
        "minLength": weird_ints,
        "maxLength": weird_ints,
        "pattern": st.sampled_from(["^a+$", "(?=x)", "[", "\\d{3}", "a{99999}", "(a|b)*c"]) | short_text,
        "format": st.sampled_from(["date-time", "email", "uuid", "nonsense"]),
        "minimum": weird_ints | weird_floats,
        "maximum": weird_ints | weird_floats,
        "$ref": st.sampled_from(["#", "#/properties/a", "#/$defs/x", "nonsense", "http://example.com/s.json"]),
    },
)
schemas = st.recursive(
    _schema_leaf,
    lambda inner: st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["object", "array"]),
            "properties": st.dictionaries(st.sampled_from(["a", "b", "c"]) | short_text, inner, max_size=3),
            "required": st.lists(st.sampled_from(["a", "b", "c"]) | short_text, max_size=3),
            "items": inner,
            "anyOf": st.lists(inner, min_size=1, max_size=3),
            "oneOf": st.lists(inner, min_size=1, max_size=2),
            "allOf": st.lists(inner, min_size=1, max_size=2),
            "not": inner,
            "additionalProperties": st.booleans() | inner,
            "$defs": st.dictionaries(st.sampled_from(["x", "y"]), inner, max_size=2),
            "minItems": weird_ints,
            "maxItems": weird_ints,
            "uniqueItems": st.booleans(),
        },
    ),
    max_leaves=10,
)
schema_case = st.tuples(
    st.sampled_from(["json-schema", "tool", "raw"]),
    st.one_of(schemas.map(lambda s: {**s, "type": "object"}), schemas, json_values),
    st.sampled_from(["8", "1", "30"]),
)


# ---------------------------------------------------------------------------------------------- options
def _opt(flag: str, values=number_text):
    return (flag, values)


_SAMPLING = ["--temp", "--top-p", "--top-k", "--min-p"]
_COMMON = [_opt("--compute-dtype", st.sampled_from(["auto", "float32", "bfloat16", "float16", ""]) | short_text)]
_COMMON += [
    _opt("-p", prompt_text),
    _opt("--system", prompt_text),
    _opt("--order", st.sampled_from(["lesson", "mlx-lm", "x"])),
]
_PROMPT_FLAGS = ["--json", "--no-chat", "--thinking", "--raw-special-tokens"]
FLAGS = {
    "topk": _PROMPT_FLAGS + ["--explain"],
    "generate": _PROMPT_FLAGS + ["--explain-mask"],
    "sample": _PROMPT_FLAGS + ["--csv"],
    "count": ["--json"],
    "quantize": ["--json", "--force", "--report"],
    "quality": ["--json", "--no-such-flag"],
}
small_count = st.one_of(st.integers(-3, 12).map(str), number_text)
COMMANDS = {
    "topk": [_opt("--rows"), _opt("-k"), _opt("--temps"), *(_opt(f) for f in _SAMPLING)],
    "generate": [
        _opt("--max-tokens", small_count),
        _opt("--seed"),
        _opt("--logprobs", small_count),
        _opt("--repetition-penalty"),
        _opt("--presence-penalty"),
        _opt("--frequency-penalty"),
        _opt("--json-schema", st.sampled_from(['{"type":"object"}', "{", "[]", "no-such-file.json", '{"type":"x"}'])),
        *(_opt(f) for f in _SAMPLING),
    ],
    "sample": [
        _opt("--seeds", small_count),
        _opt("--seed-range", st.sampled_from(["0:3", "3:0", "0:99999999999999999999", "a:b", "1:2:3"]) | number_text),
        _opt("--batch-size", small_count),
        _opt("--max-tokens", small_count),
        *(_opt(f) for f in _SAMPLING),
    ],
    "count": [_opt("--context"), _opt("--answer-tokens"), _opt("--flops"), _opt("--bandwidth")],
    "quantize": [
        _opt("--bits", st.sampled_from(["2", "3", "4", "8", "16"]) | number_text),
        _opt("--group-size", st.sampled_from(["32", "64", "128"]) | number_text),
        _opt("--head-bits", number_text),
        _opt("--embed-bits", number_text),
        _opt("--dtype", st.sampled_from(["bf16", "f16", "f32", "x"]) | short_text),
        _opt("--max-shard-size", st.sampled_from(["1KB", "5GiB", "0B", "1e9", "-1MB"]) | number_text),
    ],
    "quality": [_opt("--max-tokens", small_count), _opt("--window", small_count), _opt("--text", st.just("BYTES"))],
}


def _options(command: str):
    """One to three of the command's options, each with a drawn value (the rest keep their defaults, so
    that one odd value at a time reaches the code behind the option parser)."""
    choices = COMMANDS[command] + (_COMMON if command in ("topk", "generate", "sample") else [])
    return st.lists(st.sampled_from(range(len(choices))), min_size=1, max_size=3, unique=True).flatmap(
        lambda picked: st.tuples(*(st.tuples(st.just(choices[i][0]), choices[i][1]) for i in picked))
    )


cli_case = st.sampled_from(sorted(COMMANDS)).flatmap(
    lambda command: st.tuples(
        st.just(command),
        _options(command),
        st.lists(st.sampled_from(FLAGS[command]), max_size=3, unique=True),
        st.binary(max_size=64) | st.text(max_size=200).map(str.encode),
    )
)
