"""Hostile model files: every size, count and offset read from a GGUF header, a safetensors header or a
config.json is checked against the file before anything is built from it. Each case was a crash
(SIGFPE), a hang, a traceback or a silent wrong result; now it is one line on stderr and exit 2."""

from __future__ import annotations

import json
import os
import shutil
import struct

import mlx.core as mx
import numpy as np
import pytest
from conftest import assert_one_line_error, invoke_cli, run_cli

import mlxinfer

import checkpoints
import hostile
from mlxinfer.errors import MlxinferError
from mlxinfer.formats import gguf as gguf_reader
from mlxinfer.formats.config import ModelConfig

gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def spec(checkpoint_dir):
    """The tiny llama as a Q8_0 GGUF, in a form whose every field a test can change."""
    return hostile.tiny_gguf(checkpoint_dir("llama"))


@pytest.fixture(scope="module")
def wide_spec(tmp_path_factory):
    """A tiny llama whose vocabulary (4,160) is over 32x its hidden size (128): the shape that, stored
    with its dims swapped, made the loader infer a quantization group size of 0 (SIGFPE in MLX)."""
    hf = checkpoints.write_checkpoint(tmp_path_factory.mktemp("wide") / "hf", "llama", vocab_size=4160)
    return hostile.tiny_gguf(hf)


def _written(spec, tmp_path, change=None, name="bad.gguf"):
    bad = spec.copy()
    if change is not None:
        change(bad)
    return str(bad.write(tmp_path / name))


# ---------------------------------------------------------------------------------------------- crashes
def _swap_embedding_dims(s):
    t = s.tensor("token_embd.weight")
    t.dims = list(reversed(t.dims))  # same byte count, rows and columns exchanged


@pytest.mark.slow
def test_gguf_shape_against_its_quantized_bytes(wide_spec, tmp_path):
    """Was: SIGFPE (exit 136) in topk, convert and quantize. The rows the swapped table gives are fewer than the
    tokenizer's tokens: said before the layout is looked at."""
    path = _written(wide_spec, tmp_path, _swap_embedding_dims)
    for args in (["topk", "-m", path, "-p", "hi"], ["convert", path, str(tmp_path / "c")]):
        assert_one_line_error(run_cli(*args), "tokens but token_embd.weight has only 128 rows")
    assert not (tmp_path / "c").exists()


@pytest.mark.slow
def test_safetensors_scales_wider_than_their_weights(checkpoint_dir, tmp_path):
    """Was: SIGFPE. A 4-bit checkpoint without its quantization block, one module's scales widened."""
    bad = tmp_path / "bad"
    shutil.copytree(checkpoint_dir("llama", 4, 64), bad)
    cfg = json.loads((bad / "config.json").read_text())
    for key in ("quantization", "quantization_config"):
        cfg.pop(key, None)
    (bad / "config.json").write_text(json.dumps(cfg))
    weights = mx.load(str(bad / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj"
    weights[f"{name}.scales"] = weights[f"{name}.biases"] = mx.zeros((128, 300), dtype=mx.bfloat16)
    mx.save_safetensors(str(bad / "model.safetensors"), weights)
    assert_one_line_error(run_cli("topk", "-m", str(bad), "-p", "hi"), name, "no MLX layout")


# ---------------------------------------------------------------------------------------------- hangs
@pytest.mark.slow
def test_gguf_block_count_against_the_tensors(spec, tmp_path):
    """Was: a hang with unbounded memory in topk and in count (which needs no MLX)."""
    path = _written(spec, tmp_path, lambda s: s.set_meta("llama.block_count", hostile.U32, 10**9))
    for command in (["count", path], ["topk", "-m", path, "-p", "hi"]):
        assert_one_line_error(run_cli(*command, timeout=60), "block_count says 1,000,000,000 layers", "holds")


NOT_THEIRS = "the config and weights do not belong together: use the config.json that came with these weights"


@pytest.mark.slow
@pytest.mark.parametrize(
    "layers,fragment", [(10**9, "num_hidden_layers"), (3, f"says 3 layers but the weights hold 2; {NOT_THEIRS}")]
)
def test_config_layer_count_against_the_tensors(checkpoint_dir, tmp_path, layers, fragment):
    bad = tmp_path / "bad"
    shutil.copytree(checkpoint_dir("llama"), bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": layers}))
    assert_one_line_error(run_cli("topk", "-m", str(bad), "-p", "hi", timeout=60), fragment)
    if layers > 4096:
        assert_one_line_error(run_cli("count", str(bad), timeout=60), fragment)


# ---------------------------------------------------------------------------------------------- config.json
FIX = "; fix config.json"  # how a message about a wrong value in config.json ends: the fix, not only the fault


@pytest.mark.parametrize(
    "change,fragment,fix",
    [
        ('"max_position_embeddings": 1e400', "'max_position_embeddings'", FIX),  # inf: was an OverflowError
        ('"hidden_size": 1180591620717411303424', "'hidden_size'", FIX),  # 2**70: was an MLX TypeError
        ('"hidden_size": null', "'hidden_size'", FIX),
        ('"rms_norm_eps": "small"', "'rms_norm_eps'", FIX),
        ('"rope_theta": -1', "'rope_theta'", FIX),
        ('"max_position_embeddings": 0', "'max_position_embeddings'", FIX),  # was: silently 2048
        ('"rope_scaling": [1, 2]', "rope_scaling", FIX),
        ('"rope_scaling": {"rope_type": "linear"}', "'factor'", FIX),
        (
            '"rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1}',
            "high",
            FIX,
        ),
        ('"rope_scaling": {"rope_type": "yarn", "factor": 4}', "'yarn'", "; supported: default, linear, llama3"),
        ('"torch_dtype": ["bfloat16"]', "dtype", "; use one of bfloat16, float16, float32"),
        ('"model_type": ["llama"]', "'model_type'", FIX),
        ('"quantization": {"bits": "4", "group_size": 64}', "'quantization'", FIX),
        ('"quantization": {"bits": 4, "group_size": 64, "lm_head": {"bits": 8}}', "'lm_head'", FIX),
        ('"quantization": {"bits": 4, "group_size": 0}', "'quantization'", FIX),
        ('"tie_word_embeddings": "false"', "'tie_word_embeddings' must be true or false", FIX),  # was: read as tied
        ('"num_key_value_heads": 0', "'num_key_value_heads'", FIX),  # was: silently as many as the query heads
        ('"num_key_value_heads": 3', "num_key_value_heads 3", FIX),  # 4 query heads
        ('"attention_bias": "no"', "'attention_bias'", FIX),
        ('"head_dim": 0', "'head_dim'", FIX),  # was: read as unset, hidden_size / heads
    ],
)
def test_config_values_are_checked(checkpoint_dir, tmp_path, change, fragment, fix):
    """Each message names the key and ends with what to do about it."""
    bad = tmp_path / "bad"
    shutil.copytree(checkpoint_dir("llama"), bad)
    text = (bad / "config.json").read_text().rstrip().rstrip("}")
    (bad / "config.json").write_text(text + ", " + change + "}")
    for args in (["count", str(bad)], ["topk", "-m", str(bad), "-p", "hi"]):
        result = invoke_cli(*args)
        assert_one_line_error(result, fragment)
        assert result.stderr.strip().endswith(fix), result.stderr


@pytest.mark.parametrize(
    "change,fragment",
    [
        ({"num_experts_per_tok": 9}, "num_experts_per_tok 9"),
        ({"mlp_only_layers": "0"}, "'mlp_only_layers'"),
        ({"decoder_sparse_step": -1}, "'decoder_sparse_step'"),
        ({"moe_intermediate_size": 0.5}, "'moe_intermediate_size'"),
    ],
)
def test_config_expert_values_are_checked(change, fragment):
    """A mixture's fields, as for the dense ones; from a GGUF file (its metadata made a config) the fix
    is the file's, not config.json's."""
    cfg = {**checkpoints.BASE, **checkpoints.MLX_LM_ARCHS["qwen3_moe"], **change}
    with pytest.raises(MlxinferError) as raised:
        ModelConfig.from_dict(cfg, where="m/config.json")
    assert fragment in str(raised.value) and str(raised.value).endswith(FIX), raised.value
    with pytest.raises(MlxinferError) as raised:
        ModelConfig.from_dict(cfg, where="m.gguf", fix=gguf_reader.METADATA_FIX)
    assert str(raised.value).endswith("; " + gguf_reader.METADATA_FIX) and "config.json" not in str(raised.value)


def test_a_tokenizer_id_past_the_output_table_is_refused(checkpoint_dir, tmp_path):
    """Was: a vocabulary with a gap (as few tokens as the table has rows, one id past them) passed the
    check on the token count, then read an embedding row out of bounds: SIGSEGV, or a wrong table."""
    bad = tmp_path / "bad"
    shutil.copytree(checkpoint_dir("llama"), bad)
    vocab_size = json.loads((bad / "config.json").read_text())["vocab_size"]
    tok = json.loads((bad / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    name = max(vocab, key=vocab.get)
    vocab[name] = vocab_size + 100
    (bad / "tokenizer.json").write_text(json.dumps(tok))
    for args in (["topk", "-m", str(bad), "-p", "hi", "--no-chat"], ["generate", "-m", str(bad), "-p", "hi"]):
        assert_one_line_error(run_cli(*args), f"token ids up to {vocab_size + 100:,}", "another model")


@pytest.mark.parametrize(
    "write,fragment",
    [
        (lambda d: (d / "config.json").write_text("[" * 100_000), "not valid JSON"),  # was a RecursionError
        (lambda d: ((d / "config.json").unlink(), (d / "config.json").mkdir()), "config.json is a directory"),
        (lambda d: ((d / "model.safetensors").unlink(), (d / "model.safetensors").mkdir()), "is a directory"),
        (lambda d: ((d / "model.safetensors").unlink(), (d / "model.safetensors").symlink_to(d / "gone")), "gone"),
    ],
    ids=["deeply-nested", "a-directory", "weights-a-directory", "weights-a-broken-link"],
)
def test_unreadable_config(checkpoint_dir, tmp_path, write, fragment):
    bad = tmp_path / "bad"
    shutil.copytree(checkpoint_dir("llama"), bad)
    write(bad)
    assert_one_line_error(invoke_cli("count", str(bad)), fragment)


@pytest.mark.parametrize(
    "change, fragment",
    [
        ({"num_hidden_layers": 10**9}, "num_hidden_layers must be a whole number from 1 to 4,096"),  # was: memory out
        ({"hidden_size": 2**40}, "hidden_size must be"),  # was: an OverflowError traceback
        ({"vocab_size": 4e9}, "vocab_size must be"),
        ({"num_attention_heads": 0}, "num_attention_heads must be"),  # was: a ZeroDivisionError traceback
        ({"num_hidden_layers": 40}, "the config says 40 layers but the weights hold"),
    ],
    ids=["layers-1e9", "hidden-2**40", "vocab-float", "heads-0", "more-layers-than-weights"],
)
def test_a_config_for_mlx_lms_class_is_checked_before_the_class_is_built(mlx_lm_dir, tmp_path, change, fragment):
    """olmo2 runs on mlx-lm's class (no definition of ours): its sizes get the described configs' bounds."""
    bad = tmp_path / "bad"
    shutil.copytree(mlx_lm_dir("olmo2"), bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, **change}))
    assert_one_line_error(invoke_cli("topk", "-m", str(bad), "-p", "hi"), fragment)


def _replace(path, make):
    path.unlink(missing_ok=True)
    make(path)


@pytest.mark.parametrize(
    "name, make, fragment",
    [
        ("generation_config.json", lambda p: p.symlink_to("/dev/zero"), "is a device"),  # was: MemoryError
        ("generation_config.json", lambda p: os.mkfifo(p), "is a pipe"),  # was: a hang
        ("tokenizer.json", lambda p: p.symlink_to("/dev/zero"), "is a device"),  # was: 3 GB read, then a traceback
        ("tokenizer_config.json", lambda p: os.mkfifo(p), "is a pipe"),
        ("config.json", lambda p: p.write_text('{"junk": [' + "[]," * 2_000_000 + "[]]}"), "over 4,194,304 bytes"),
    ],  # the last: parsed, a 6 MB config.json of empty lists took ~400 MB (a 99 MB one, 5.7 GB)
    ids=[
        "generation-config-dev-zero",
        "generation-config-fifo",
        "tokenizer-dev-zero",
        "tokenizer-config-fifo",
        "config-too-large",
    ],  # fmt: skip
)
def test_side_files_that_never_end_or_are_too_large(checkpoint_dir, tmp_path, name, make, fragment):
    bad = tmp_path / "bad"
    shutil.copytree(checkpoint_dir("llama"), bad)
    _replace(bad / name, make)
    assert_one_line_error(run_cli("topk", "-m", str(bad), "-p", "hi", timeout=120), name, fragment)


# ---------------------------------------------------------------------------------------------- GGUF headers
def _array_count(n):
    return struct.pack("<IIQ", hostile.ARRAY, hostile.U64, n)  # a type, then an item type and a count


def _nested(depth):
    return struct.pack("<I", hostile.ARRAY) + struct.pack("<IQ", hostile.ARRAY, 1) * depth + struct.pack("<IQ", 4, 0)


def _move(name, offset):
    def change(s):
        s.tensor(name).offset = offset

    return change


def _tensor(which, **fields):
    def change(s):
        for k, v in fields.items():
            setattr(s.tensor(which), k, v)

    return change


@pytest.mark.parametrize(
    "change,fragment",
    [
        (lambda s: s.set_meta("general.alignment", hostile.U32, 0), "alignment 0"),  # was ZeroDivisionError
        (lambda s: s.set_meta("general.alignment", hostile.U32, 48), "alignment 48"),
        (lambda s: s.set_meta("general.alignment", hostile.STRING, "32"), "alignment"),
        (_move("blk.0.ffn_down.weight", 8), "alignment"),
        (_move("blk.0.ffn_down.weight", 0), "overlap"),
        (_tensor("blk.0.ffn_down.weight", name="blk.0.ffn_up.weight"), "listed twice"),
        (_tensor("blk.0.attn_norm.weight", dims=[128, 1, 1, 1, 1, 1, 1]), "7 dimensions"),
        (_tensor("blk.0.attn_norm.weight", dims=[128, 0]), "dimensions"),
        (_tensor("blk.0.ffn_down.weight", dims=[250, 128]), "Q8_0 cannot store"),
        (_tensor("blk.0.ffn_down.weight", type_id=99), "unknown ggml type 99"),
        (_tensor("blk.0.ffn_down.weight", offset=2**62), "truncated"),
        (lambda s: s.set_meta("x", hostile.RAW, _array_count(2**60)), "more than the file can hold"),
        (lambda s: s.set_meta("x", hostile.RAW, _nested(50_000)), "corrupt header"),  # was a RecursionError
        (lambda s: s.set_meta("x", hostile.RAW, struct.pack("<I", 77)), "unknown value type 77"),
        (lambda s: s.set_meta("x", hostile.RAW, struct.pack("<IQ", hostile.STRING, 2**62)), "string bytes"),
    ],
)
def test_gguf_header_is_checked_against_the_file(spec, tmp_path, change, fragment):
    path = _written(spec, tmp_path, change)
    result = invoke_cli("count", path)
    assert_one_line_error(result, fragment)
    assert any(fix in result.stderr for fix in ("re-download", "convert the model again", "re-quantize")), result.stderr


@pytest.mark.slow
def test_gguf_metadata_that_disagrees_with_its_tensors_is_named_by_count_and_topk(spec, tmp_path):
    """A block_count below the blk.N tensors present loaded in neither topk nor count's check (count gave a
    table); a head count that gives other shapes than the tensors' was "+65,536 parameters stored beyond the
    count" in count; an embedding length that disagrees named no file in topk."""
    fewer = _written(spec, tmp_path, lambda s: s.set_meta("llama.block_count", hostile.U32, 1), "fewer.gguf")
    for command in (["count", fewer], ["topk", "-m", fewer, "-p", "hi"]):
        assert_one_line_error(run_cli(*command, timeout=60), "block_count says 1 layers", "blk.0 to blk.1")
    kv = spec.meta("llama.attention.head_count_kv")
    heads = _written(spec, tmp_path, lambda s: s.set_meta("llama.attention.head_count_kv", hostile.U32, kv // 2))
    notes = json.loads(invoke_cli("count", heads, "--json").stdout)["stored"]["notes"]
    said = next(n for n in notes if "attn_k.weight" in n)
    assert "metadata implies" in said and "will not load" in said, notes
    assert not any("beyond the count" in n for n in notes), notes
    error = run_cli("topk", "-m", heads, "-p", "hi", timeout=60)
    assert_one_line_error(error, "attn_k" if "attn_k" in error.stderr else "k_proj", "re-download or re-convert")


def _tokens(s, change):
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
        kind, values = s.meta(key)
        s.set_meta(key, hostile.ARRAY, (kind, change(list(values), key)))


def test_more_tokens_than_embedding_rows_and_a_partial_rope_are_refused(spec, tmp_path):
    """Was: a token list longer than token_embd's rows loaded (its last tokens without an embedding), and a
    rope.dimension_count of half the heads' width was ignored (every dimension rotated); llama.cpp refuses both.
    A list shorter than the rows is a padded table (the fixture's own: fewer tokens than rows) and loads."""
    rows, n = spec.tensor("token_embd.weight").dims[-1], len(spec.meta("tokenizer.ggml.tokens")[1])
    extra = {
        "tokenizer.ggml.tokens": [f"x{i}" for i in range(rows - n + 2)],
        "tokenizer.ggml.token_type": [1] * (rows - n + 2),
    }
    more = _written(spec, tmp_path, lambda s: _tokens(s, lambda v, key: v + extra[key]))
    said = f"tokenizer.ggml.tokens holds {rows + 2:,} tokens but token_embd.weight has only {rows:,} rows"
    for command in (["count", more], ["topk", "-m", more, "-p", "hi"]):
        assert_one_line_error(invoke_cli(*command), said)
    width = spec.meta("llama.embedding_length") // spec.meta("llama.attention.head_count")
    half = _written(spec, tmp_path, lambda s: s.set_meta("llama.rope.dimension_count", hostile.U32, width // 2))
    assert_one_line_error(invoke_cli("topk", "-m", half, "-p", "hi"), f"rope.dimension_count is {width // 2}")
    whole = _written(spec, tmp_path, lambda s: s.set_meta("llama.rope.dimension_count", hostile.U32, width), "w.gguf")
    assert n < rows and invoke_cli("topk", "-m", whole, "-p", "hi").returncode == 0


def test_a_huge_name_read_from_a_file_is_no_huge_error_line(spec, tmp_path):
    """A tensor named with 100,000 characters printed a 100 KB error "line"; it is cut to a readable one."""
    path = _written(spec, tmp_path, _tensor("blk.0.ffn_down.weight", name="blk.0." + "x" * 100_000))
    result = invoke_cli("topk", "-m", path, "-p", "hi")
    assert result.returncode == 2 and 0 < len(result.stderr) < 2_200, len(result.stderr)
    assert result.stderr.startswith("error: ") and " ... " in result.stderr


def _rope_freqs(s):
    heads, width = s.meta("llama.attention.head_count"), s.meta("llama.embedding_length")
    s.tensors.append(hostile.tensor("rope_freqs.weight", np.ones(width // heads // 2, np.float32), "F32"))
    return s


@pytest.mark.parametrize(
    "change,fragment",
    [
        (lambda s: s.set_meta("llama.block_count", hostile.STRING, "30"), "'llama.block_count'"),
        # with Llama 3.1's rope_freqs.weight, read before the config's checks: was a TypeError traceback
        (lambda s: _rope_freqs(s).set_meta("llama.rope.freq_base", hostile.STRING, "x"), "'llama.rope.freq_base'"),
        (lambda s: _rope_freqs(s).set_meta("llama.rope.freq_base", hostile.F32, -1.0), "'llama.rope.freq_base'"),
        (lambda s: _rope_freqs(s).set_meta("llama.attention.key_length", hostile.STRING, "x"), "key_length"),
        (
            lambda s: s.set_meta("llama.attention.layer_norm_rms_epsilon", hostile.STRING, "x"),
            "'llama.attention.layer_norm_rms_epsilon'",
        ),
    ],
)
def test_gguf_metadata_values_are_checked(spec, tmp_path, change, fragment):
    """The metadata read as a config, checked as config.json is; the fix is the file's (there is no
    config.json to correct)."""
    result = invoke_cli("count", _written(spec, tmp_path, change))
    assert_one_line_error(result, fragment)
    assert result.stderr.strip().endswith("; " + gguf_reader.METADATA_FIX), result.stderr
    assert "config.json" not in result.stderr


@pytest.mark.parametrize(
    "change,fragment",
    [
        (lambda s: s.drop_meta("tokenizer.ggml.tokens"), "tokenizer.ggml.tokens"),  # was a KeyError
        (lambda s: s.set_meta("tokenizer.ggml.tokens", hostile.ARRAY, (hostile.I32, [1, 2])), "tokens"),
        (lambda s: s.set_meta("tokenizer.ggml.merges", hostile.ARRAY, (hostile.STRING, ["ab"])), "merges"),
        # was: accepted, every character its own token (llama.cpp refuses a BPE without merges)
        (lambda s: s.drop_meta("tokenizer.ggml.merges"), "tokenizer.ggml.merges"),
        (lambda s: s.set_meta("tokenizer.ggml.merges", hostile.ARRAY, (hostile.STRING, [])), "tokenizer.ggml.merges"),
        (lambda s: s.set_meta("tokenizer.ggml.pre", hostile.ARRAY, (hostile.U8, [1])), "pre-tokenizer"),
        (lambda s: s.set_meta("tokenizer.chat_template", hostile.U32, 7), "chat_template"),
        # was: accepted, and wrong: specials past the short list split into characters; no stop at the
        # end of a turn (and convert wrote the id into generation_config.json); "false" read as true
        (lambda s: s.set_meta("tokenizer.ggml.token_type", hostile.ARRAY, (hostile.I32, [3])), "1 types for"),
        (lambda s: s.set_meta("tokenizer.ggml.eos_token_id", hostile.U32, 4_000_000_000), "eos_token_id 4000000000"),
        (lambda s: s.set_meta("tokenizer.ggml.add_bos_token", hostile.STRING, "false"), "add_bos_token is 'false'"),
    ],
)
def test_gguf_tokenizer_metadata(spec, tmp_path, change, fragment):
    path = _written(spec, tmp_path, change)
    assert_one_line_error(invoke_cli("topk", "-m", path, "-p", "hi"), fragment)


@pytest.mark.slow
@pytest.mark.parametrize(
    "value", [(hostile.F64, 0.5), (hostile.ARRAY, (hostile.F64, [0.5, 1.5]))], ids=["scalar", "array"]
)
def test_gguf_float64_metadata(spec, tmp_path, value):
    """Found by the fuzzer: MLX's GGUF reader dies with SIGSEGV on any FLOAT64 metadata value (a type the
    format defines). Such a file is read without mx.load (the gguf package's path, model/gguf_tensors.py):
    the same next-token table as the file without the value; count reads it too."""
    path = _written(spec, tmp_path, lambda s: s.set_meta("general.some_ratio", *value))
    plain = _written(spec, tmp_path, name="plain.gguf")
    got, want = (run_cli("topk", "-m", p, "-p", "hi", "--json") for p in (path, plain))
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout)["rows"] == json.loads(want.stdout)["rows"]
    assert invoke_cli("count", path).returncode == 0


def test_metadata_of_an_unexpected_type_found_by_the_fuzzer(spec, checkpoint_dir, tmp_path):
    """Both were TypeError tracebacks: a GGUF whose tokenizer.ggml.tokens is a number (count needs no
    vocabulary list; topk does), and a config.json whose quantization_config is a number (not MLX's block)."""
    path = _written(spec, tmp_path, lambda s: s.set_meta("tokenizer.ggml.tokens", hostile.F32, 0.5))
    assert invoke_cli("count", path).returncode == 0
    assert_one_line_error(invoke_cli("topk", "-m", path, "-p", "hi"), "tokenizer.ggml.tokens")
    bad = tmp_path / "bad"
    shutil.copytree(checkpoint_dir("llama"), bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "quantization_config": 3}))
    assert invoke_cli("count", str(bad)).returncode == 0


# ---------------------------------------------------------------------------------------------- NaN
def _fill_ff(s):
    for t in s.tensors:
        t.data = b"\xff" * len(t.data)  # F32 and the Q8_0 scales (f16) decode to NaN


def test_gguf_data_of_0xff_is_an_error_not_a_table(spec, tmp_path):
    """Was: exit 0 and NaN scores (`--json` printed a bare NaN)."""
    path = _written(spec, tmp_path, _fill_ff)
    for args in (["topk", "--json"], ["generate", "--max-tokens", "3"]):
        result = invoke_cli(*args, "-m", path, "-p", "hi")
        assert_one_line_error(result, "NaN or inf from the embedding (model.embed_tokens)", "--debug")
    detailed = invoke_cli("--debug", "topk", "-m", path, "-p", "hi")
    assert detailed.returncode == 2 and detailed.stdout == ""
    lines = detailed.stderr.splitlines()
    assert lines[0].startswith("error: ") and "--debug" not in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["the", "layer", "layer", "the"]  # embedding, 2 layers, output


@pytest.mark.parametrize("kind, at", [("Q4_0", 0), ("Q5_0", 0), ("Q8_0", 0), ("IQ4_XS", 0), ("Q6_K", -2), ("Q2_K", -2)])
def test_gguf_scales_of_signaling_nan_warn_nothing(kind, at):
    """Found by the fuzzer: a block scale that is a signaling NaN made numpy (and gguf-py's dequantizer)
    print a RuntimeWarning, two lines on stderr before the one-line error of the forward pass's NaN check."""
    import warnings

    from mlxinfer.formats.ggml_types import BY_NAME
    from mlxinfer.model import gguf_tensors

    _, size = BY_NAME[kind]
    block = bytearray(size)
    block[at % size : at % size + 2] = b"\x01\x7c"  # the float16 scale (d, or a K-quant's dmin), a signaling NaN
    blocks = np.frombuffer(bytes(block) * 2, np.uint8).reshape(1, 2 * size)  # one row of two blocks
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        if kind in gguf_tensors.EXACT:
            _, got, _ = gguf_tensors._exact(kind, blocks)  # the scales
        else:  # re-fit: the float32 values first
            got = gguf_tensors._values(kind, blocks)
    assert np.isnan(np.asarray(got, np.float32)).any()


def test_nan_in_one_layer_is_named(checkpoint_dir, tmp_path):
    bad = checkpoints.corrupt_copy(checkpoint_dir("llama"), tmp_path / "bad")
    assert_one_line_error(invoke_cli("topk", "-m", str(bad), "-p", "hi"), "from layer 1 (model.layers.1) on")


# ---------------------------------------------------------------------------------------------- safetensors
def _edit_header(directory, edit):
    header, data = hostile.read_safetensors(directory / "model.safetensors")
    edit(header)
    hostile.write_safetensors(directory / "model.safetensors", header, data)


def _unknown_dtype(h):
    h["model.norm.weight"]["dtype"] = "X99"


def _overlap(h):
    h["model.layers.0.mlp.up_proj.weight"]["data_offsets"] = h["model.layers.0.mlp.gate_proj.weight"]["data_offsets"]


def _float_shape(h):
    h["model.norm.weight"]["shape"] = [127.5, 1]


@pytest.mark.parametrize(
    "edit,fragment",
    [(_unknown_dtype, "dtype 'X99'"), (_overlap, "share bytes"), (_float_shape, "entry 'model.norm.weight'")],
    ids=["unknown-dtype", "overlap", "float-shape"],
)
def test_safetensors_header_is_checked(checkpoint_dir, tmp_path, edit, fragment):
    """Was: count accepted these (and printed a negative header size); the loader then refused or misread.
    Then: the overlap and the bad entry named the problem but not the fix."""
    bad = tmp_path / "bad"
    shutil.copytree(checkpoint_dir("llama"), bad)
    _edit_header(bad, edit)
    for args in (["count", str(bad)], ["topk", "-m", str(bad), "-p", "hi"]):
        result = invoke_cli(*args)
        assert_one_line_error(result, fragment)
        assert result.stderr.strip().endswith("; re-download it"), result.stderr  # the fix too (was: overlap, entry)


def test_weights_stored_as_integers_are_refused(checkpoint_dir, tmp_path):
    """A bf16 weight's bytes labelled I16 (the same shape and size): was an AssertionError traceback on the
    default path, garbage scores with exit 0 as stored, and quantize wrote the integers quantized."""
    bad = tmp_path / "bad"
    shutil.copytree(checkpoint_dir("llama"), bad)
    header, data = hostile.read_safetensors(bad / "model.safetensors")
    header["model.layers.0.self_attn.q_proj.weight"]["dtype"] = "I16"
    hostile.write_safetensors(bad / "model.safetensors", header, data)
    for args in (["topk", "-m", str(bad), "-p", "hi"], ["topk", "-m", str(bad), "-p", "hi", "--compute-dtype",
                 "bfloat16"], ["quantize", str(bad), str(tmp_path / "q")]):  # fmt: skip
        assert_one_line_error(invoke_cli(*args), "q_proj.weight' is stored as int16", "floating-point")
    assert not (tmp_path / "q").exists()


def test_a_cut_or_float64_safetensors_file_says_what_to_do(checkpoint_dir, tmp_path):
    from safetensors.numpy import save_file

    bad = tmp_path / "bad"
    shutil.copytree(checkpoint_dir("llama"), bad)
    save_file({"extra.weight": np.zeros(4, np.float64)}, str(bad / "extra.safetensors"))
    result = invoke_cli("topk", "-m", str(bad), "-p", "hi")
    assert_one_line_error(result, "extra.safetensors", "MLX cannot load", "convert")  # was: "re-download it"
    (bad / "extra.safetensors").unlink()
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert_one_line_error(invoke_cli("topk", "-m", str(bad), "-p", "hi"), "a cut download?", "re-download it")


@pytest.mark.parametrize(
    "change, said",
    [
        (lambda s: s.set_meta("llama.attention.head_count", hostile.U32, 6),
         "llama.embedding_length 128 is not divisible by llama.attention.head_count 6"),
        (lambda s: s.set_meta("llama.attention.head_count_kv", hostile.U32, 3),
         "llama.attention.head_count 4 is not a multiple of llama.attention.head_count_kv 3"),
        (lambda s: s.set_meta("llama.feed_forward_length", hostile.U32, 0), "llama.feed_forward_length"),
        (lambda s: s.drop_meta("llama.context_length"), "GGUF metadata lacks llama.context_length"),
    ],
)  # fmt: skip
def test_gguf_metadata_is_named_by_its_own_keys(spec, tmp_path, change, said):
    """A GGUF's hyperparameters are checked as config.json's are, but said in the file's keys, the names a
    reader of the file can look up (was: config.json's names, and 'add an explicit head_dim')."""
    header = gguf_reader.read_header(_written(spec, tmp_path, change))
    with pytest.raises(MlxinferError) as e:
        gguf_reader.config_from_header(header)
    message = str(e.value)
    assert said in message and "\n" not in message, message
    assert not any(field in message for field in gguf_reader.GGUF_KEYS if field != "vocab_size"), message
    assert "add an explicit" not in message and str(tmp_path) in message


@pytest.mark.parametrize(
    "eos",
    ["x", "<|im_end|>", [1, -5, "x"], True, 99_999_999_999, [-5], []],
    ids=["string", "token-text", "mixed-list", "true", "past-vocabulary", "negative", "empty-list"],
)
def test_a_generation_config_eos_that_is_no_token_id_is_one_line(checkpoint_dir, tmp_path, eos):
    """A string was taken apart into characters (serve and --json-schema then sorted them beside ints: a
    traceback), true read as token 1, an id past the vocabulary kept: each is now refused at load."""
    bad = tmp_path / "bad"
    shutil.copytree(checkpoint_dir("llama"), bad)
    config = json.loads((bad / "generation_config.json").read_text())
    (bad / "generation_config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    assert_one_line_error(invoke_cli("topk", "-m", str(bad), "-p", "hi"), "generation_config.json's eos_token_id")
    config["eos_token_id"] = [0, 1]  # a list of ids is what HF writes for several ends of a turn
    (bad / "generation_config.json").write_text(json.dumps(config))
    _, tok = mlxinfer.load(str(bad))
    assert {0, 1} <= set(tok.eos_token_ids)
