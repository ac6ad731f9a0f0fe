"""`count`: the lesson's figures, exactly, from config.json alone; then the files on disk.

Figures are from the lesson (seed 000_e9db8509446ceb32.txt): Qwen3-0.6B and Llama 3.1 8B counts, bytes,
shares, operations per token, the 12,060-token context and the 300-token answer.
"""

from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import invoke_cli

from mlxinfer.counting import count, parse_rate
from mlxinfer.errors import MlxinferError

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "tests" / "fixtures" / "configs"
QWEN3_06B, LLAMA_8B = CONFIGS / "qwen3-0.6b.json", CONFIGS / "llama-3.1-8b.json"
QWEN3_17B, QWEN3_17B_4BIT = CONFIGS / "qwen3-1.7b.json", CONFIGS / "qwen3-1.7b-4bit.json"

# a tiny tied Qwen3 for files the tests write: D 64, 4 heads of 16, 2 kv heads, F 128, V 100, 2 layers
TINY = {
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 100,
    "tie_word_embeddings": True,
    "torch_dtype": "float16",
}
# embedding 6,400; layer: q 4,096 + k 2,048 + v 2,048 + o 4,096 + norms 32 = 12,320 attention,
# MLP 3 x 8,192 = 24,576, norms 128 -> 37,024; total 6,400 + 2 x 37,024 + 64 = 80,512
TINY_TOTAL = 80_512


def run_cli(*args):
    """`mlxinfer count ARGS`, in this process (test_count_imports_no_framework runs it as a process)."""
    return invoke_cli("count", *map(str, args))


def assert_one_line_error(p, *fragments):
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def row(report, label):
    return next(r for r in report.rows if r["label"] == label)


# ---- the lesson's tables ---------------------------------------------------------------------------------


def test_qwen3_06b_matches_the_lesson():
    r = count(QWEN3_06B)
    assert r.embedding == 155_582_464
    assert r.attention == 6_291_712
    assert r.mlp == 9_437_184
    assert r.layer_norms == 2_048
    assert r.layer == 15_730_944
    assert r.layers == 440_466_432
    assert r.final_norm == 1_024
    assert r.output_table == 0  # "the embedding table, used again"
    assert r.total == 596_049_920
    assert r.bytes == 1_192_099_840
    assert round(100 * r.shares["mlp_of_layer"]) == 60
    assert round(100 * r.shares["vocab_tables_of_model"]) == 26
    assert row(r, "query")["params"] == 1_024 * 2_048 and row(r, "query")["formula"] == "1,024 x (16 x 128)"
    assert row(r, "output")["params"] == 2_048 * 1_024
    assert row(r, "query and key norms")["params"] == 256  # "plus two small norms of 128"
    assert row(r, "output table")["formula"] == "the embedding table, used again"


def test_llama_31_8b_matches_the_lesson():
    r = count(LLAMA_8B)
    assert r.embedding == 525_336_576
    assert [row(r, n)["params"] for n in ("query", "key", "value", "output")] == [
        16_777_216,
        4_194_304,
        4_194_304,
        16_777_216,
    ]
    assert r.attention == 41_943_040
    assert r.mlp == 176_160_768
    assert r.layer_norms == 8_192
    assert r.layer == 218_112_000
    assert r.layers == 6_979_584_000
    assert r.final_norm == 4_096
    assert r.output_table == 525_336_576
    assert r.total == 8_030_261_248
    assert r.bytes == 16_060_522_496
    assert (round(100 * r.shares["mlp_of_layer"]), round(100 * r.shares["attention_of_layer"])) == (81, 19)
    assert round(100 * r.shares["layers_of_model"]) == 87


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.json")), ids=lambda p: p.stem)
def test_identity_for_every_fixture(path):
    r = count(path)
    assert r.total == r.embedding + r.num_layers * r.layer + r.final_norm + r.output_table
    assert r.layer == r.attention + r.mlp + r.layer_norms
    top = [x["params"] for x in r.rows if x["indent"] == 0 and x["params"] is not None and x["label"] != "TOTAL"]
    assert sum(top) == row(r, "TOTAL")["params"] == r.total


def test_other_fixtures():
    r = count(QWEN3_17B)  # stored as 2,031,739,904 on the hub: this plus a second copy of the tied table
    assert (r.layer, r.total) == (50_336_000, 1_720_574_976)
    assert r.total + 151_936 * 2_048 == 2_031_739_904
    r = count(CONFIGS / "qwen2.5-0.5b.json")  # Qwen2: q/k/v biases; the model card's 0.49B, 0.36B non-embedding
    assert row(r, "biases")["params"] == (14 + 2 + 2) * 64
    assert r.total == 494_032_768
    assert r.total - r.embedding == 357_898_112


# ---- operations per token --------------------------------------------------------------------------------


def test_operations_llama_8b():
    o = count(LLAMA_8B).operations
    assert o["parameters_in_arithmetic"] == 7_504_924_672  # all minus the embedding lookup
    assert o["weights_per_token"] == 15_009_849_344
    assert o["attention_per_earlier_token"] == 524_288
    assert int(o["crossover_context"]) == 28_629


def test_tied_model_still_pays_for_the_output_matmul():
    o = count(QWEN3_06B).operations
    # lookup free, but the scores are a 151,936 x 1,024 matmul on the shared table: 2 x every parameter
    assert o["parameters_in_arithmetic"] == 596_049_920
    assert o["weights_per_token"] == 1_192_099_840
    assert o["attention_per_earlier_token"] == 28 * 2 * 2 * 16 * 128 == 229_376


def test_context_and_answer_llama_8b():
    r = count(LLAMA_8B, context=12_060, answer_tokens=300)
    assert r.context["attention_ops"] == 6_322_913_280
    assert round(100 * r.context["share_of_weights"]) == 42
    a = r.answer
    assert a["passes"] == 300 and a["layer_runs"] == 9_600
    assert a["weights_ops"] == 300 * 15_009_849_344 == 4_502_954_803_200  # 4.50 trillion
    # pass k looks at 12,060 + k tokens: 300 x 12,060 + (0 + 1 + ... + 299)
    assert a["attended_tokens"] == 3_618_000 + 44_850
    assert round(a["average_attended"]) == 12_210
    assert a["attention_ops"] == 524_288 * 3_662_850 == 1_920_388_300_800  # 1.92 trillion
    assert round(a["total_ops"] / 1e12, 1) == 6.4


def test_time_per_token_h100():
    r = count(LLAMA_8B, flops="989T", bandwidth="3.35TB/s")
    h = r.hardware
    assert h["ops"] == 15_009_849_344
    # every weight but the embedding table, of which one row: (8,030,261,248 - 525,336,576 + 4,096) x 2
    assert h["bytes_read"] == 15_009_857_536
    assert h["compute_s"] == pytest.approx(15_009_849_344 / 989e12)
    assert h["memory_s"] == pytest.approx(15_009_857_536 / 3.35e12)  # about 4.5 ms
    assert h["binds"] == "memory"
    h = count(LLAMA_8B, context=12_060, flops=989e12, bandwidth=3.35e12).hardware
    assert h["bytes_read"] == 15_009_857_536 + 2 * 32 * 8 * 128 * 2 * 12_060  # + the KV cache
    assert h["ops"] == 15_009_849_344 + 6_322_913_280


def test_parse_rate():
    assert parse_rate("989T", "flops") == 989e12
    assert parse_rate("989 TFLOP/s", "flops") == 989e12
    assert parse_rate("3.35TB/s", "bandwidth") == 3.35e12
    assert parse_rate("400GB/s", "bandwidth") == 400e9
    assert parse_rate("2GiB/s", "bandwidth") == 2 * 2**30
    assert parse_rate("1.5e12", "flops") == 1.5e12
    assert parse_rate(400e9, "bandwidth") == 400e9
    for bad in ("fast", "3.35TB/s", "0", "-5T"):
        with pytest.raises(MlxinferError):
            parse_rate(bad, "flops")
    # was: "400" read as 400 bytes per second, where bench reads a bare 400 as GB/s
    with pytest.raises(MlxinferError, match="no unit.*400GB/s"):
        parse_rate("400", "bandwidth")
    assert parse_rate("400B/s", "bandwidth") == 400


@pytest.mark.parametrize(
    "kwargs",
    [dict(context=-1), dict(context=0), dict(answer_tokens=300), dict(context=10, answer_tokens=-3), dict(flops="0")],
)
def test_out_of_range(kwargs):
    with pytest.raises(MlxinferError):
        count(LLAMA_8B, **kwargs)


# ---- quantization ----------------------------------------------------------------------------------------


def test_qwen3_17b_4bit():
    q = count(QWEN3_17B_4BIT).quantization
    assert q["bits_per_quantized_weight"] == 4.5  # 4 bits + (16-bit scale + 16-bit bias) / 64
    # every Linear and the embedding: 1,720,451,072 weights x 4.5 / 8; norms stay bf16: 123,904 x 2
    assert q["quantized_parameters"] == 1_720_451_072 and q["float_parameters"] == 123_904
    assert q["bytes"] == 1_720_451_072 * 9 // 16 + 123_904 * 2 == 968_001_536  # "about 1 GB"
    # the text says it beside the unquantized bytes, where a reader of the lesson looks first
    lines = run_cli(QWEN3_17B_4BIT).stdout.splitlines()
    at = lines.index("Bytes and shares")
    assert lines[at + 1].startswith("bytes in bfloat16, unquantized") and lines[at + 1].endswith("3.44 GB")
    assert lines[at + 2].startswith("bytes as quantized") and lines[at + 2].endswith("968,001,536   0.97 GB")


def test_per_module_override(tmp_path):
    base = dict(TINY, quantization={"group_size": 64, "bits": 4})
    over = dict(
        TINY,
        quantization={
            "group_size": 64,
            "bits": 4,
            "model.layers.0.mlp.down_proj": {"group_size": 64, "bits": 8},
            "model.layers.1.self_attn.q_proj": False,
        },
    )
    b = count(write_config(tmp_path / "a", base)).quantization["bytes"]
    o = count(write_config(tmp_path / "b", over)).quantization["bytes"]
    down, q = 8_192, 4_096  # weights in that down_proj and that q_proj
    assert o - b == down * (8.5 - 4.5) / 8 + q * (16 - 4.5) / 8


def test_quantized_bytes_match_mlx(tmp_path):
    """Cross-check against MLX's own quantization (this test may import mlx; count itself never does)."""
    mx = pytest.importorskip("mlx.core")
    nn = pytest.importorskip("mlx.nn")
    from mlx.utils import tree_flatten
    from mlx_lm.models import qwen3

    cfg = dict(
        TINY,
        hidden_size=128,
        head_dim=32,
        tie_word_embeddings=False,
        torch_dtype="bfloat16",
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_position_embeddings=4096,
    )
    quant = {"group_size": 64, "bits": 4, "model.layers.0.mlp.down_proj": {"group_size": 32, "bits": 8}}
    model = qwen3.Model(qwen3.ModelArgs.from_dict(cfg))
    model.set_dtype(mx.bfloat16)
    nn.quantize(model, 64, 4, class_predicate=lambda p, m: hasattr(m, "to_quantized") and quant.get(p, True))
    mx.save_safetensors(str(tmp_path / "model.safetensors"), dict(tree_flatten(model.parameters())))
    write_config(tmp_path, dict(cfg, quantization=quant))
    r = count(tmp_path)
    assert r.stored["tensor_bytes"] == r.quantization["bytes"]
    assert not r.stored["extra"] and not r.stored["missing"]


# ---- the files on disk -----------------------------------------------------------------------------------


def write_config(folder: Path, cfg: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def tiny_tensors(with_lm_head=True) -> dict:
    np = pytest.importorskip("numpy")
    from mlxinfer.counting.layout import model_weights
    from mlxinfer.formats.config import ModelConfig

    t = {w.name: np.ones(w.shape, dtype=np.float16) for w in model_weights(ModelConfig.from_dict(TINY))}
    if with_lm_head:  # as transformers saves a tied model: the table again under its second name
        t["lm_head.weight"] = t["model.embed_tokens.weight"].copy()
    return t


def header_length(path: Path) -> int:
    return struct.unpack("<Q", path.read_bytes()[:8])[0]


def test_tied_table_stored_twice(tmp_path):
    from safetensors.numpy import save_file

    save_file(tiny_tensors(), str(write_config(tmp_path, TINY) / "model.safetensors"))
    r = count(tmp_path)
    s = r.stored
    assert r.total == s["unique_parameters"] == TINY_TOTAL
    assert s["parameters"] == TINY_TOTAL + 100 * 64  # the table, a second time
    assert s["tensor_bytes"] == 2 * s["parameters"]
    assert s["file_bytes"] == (tmp_path / "model.safetensors").stat().st_size
    assert s["header_bytes"] == s["file_bytes"] - s["tensor_bytes"]
    assert s["header_bytes"] == 8 + header_length(tmp_path / "model.safetensors")
    assert s["extra"] == {"lm_head.weight": 6_400} and s["missing"] == []
    assert any("stored a second time" in n for n in s["notes"])


def test_sharded(tmp_path):
    from safetensors.numpy import save_file

    tensors = tiny_tensors(with_lm_head=False)
    names = sorted(tensors)
    write_config(tmp_path, TINY)
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    for fname, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(tmp_path / fname))
    weight_map = {n: f for f, part in shards.items() for n in part}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    s = count(tmp_path / "config.json").stored
    assert s["parameters"] == TINY_TOTAL and s["tensor_bytes"] == 2 * TINY_TOTAL
    assert [f["name"] for f in s["files"]] == list(shards)
    assert s["header_bytes"] == sum(8 + header_length(tmp_path / f) for f in shards)
    assert s["file_bytes"] == sum((tmp_path / f).stat().st_size for f in shards)
    assert s["extra"] == {} and any("stored exactly once" in n for n in s["notes"])


def test_qwen3_06b_file_shape(tmp_path):
    """A Qwen3-0.6B-shaped checkpoint (a hand-written header over a sparse file): the lesson's stored figures."""
    from mlxinfer.counting.layout import model_weights
    from mlxinfer.formats.config import ModelConfig

    cfg = json.loads(QWEN3_06B.read_text())
    shapes = {w.name: w.shape for w in model_weights(ModelConfig.from_dict(cfg))}
    shapes["lm_head.weight"] = (151_936, 1_024)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, shape in shapes.items():
        nbytes = 2 * math.prod(shape)  # bf16
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    write_config(tmp_path, cfg)
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + offset)  # sparse: no 1.5 GB written
    s = count(tmp_path).stored
    assert s["parameters"] == 751_632_384 and s["unique_parameters"] == 596_049_920
    assert s["tensor_bytes"] == 1_503_264_768
    assert s["header_bytes"] == 8 + len(raw)
    assert s["extra"] == {"lm_head.weight": 155_582_464}


def test_untied_decided_by_weights_when_config_is_silent(tmp_path):
    from safetensors.numpy import save_file

    cfg = {k: v for k, v in TINY.items() if k != "tie_word_embeddings"}
    save_file(tiny_tensors(), str(write_config(tmp_path, cfg) / "model.safetensors"))
    r = count(tmp_path)
    assert r.output_table == 6_400 and r.total == TINY_TOTAL + 6_400
    assert r.stored["extra"] == {}


def test_an_unknown_architecture_that_says_tied_is_not_called_silent(tmp_path):
    """Was: for a model_type this tool does not know, the note said config.json did not say, when it did."""
    from safetensors.numpy import save_file

    cfg = {**TINY, "model_type": "frobnet", "tie_word_embeddings": True}
    save_file(tiny_tensors(with_lm_head=False), str(write_config(tmp_path, cfg) / "model.safetensors"))
    r = count(tmp_path)
    assert r.config["tie_word_embeddings"] and not any("does not say" in n for n in r.notes)


def test_embedded_gguf():
    r = count(None)
    assert r.source == "gguf" and r.config["tie_word_embeddings"]
    assert r.total == 134_515_008 == r.stored["parameters"]  # SmolLM2-135M: stored once each
    assert r.total == r.embedding + r.num_layers * r.layer + r.final_norm + r.output_table
    s, q = r.stored, r.quantization
    assert s["header_bytes"] == s["file_bytes"] - s["tensor_bytes"] > 0
    assert q["types"]["Q4_1"]["bits_per_weight"] == 5.0  # 20 bytes per block of 32
    assert q["types"]["Q8_0"]["bits_per_weight"] == 8.5  # 34 bytes per block of 32
    assert q["bytes"] == s["tensor_bytes"]


def test_hub_reads_only_config_and_headers(tmp_path, monkeypatch):
    """The hub path with huggingface_hub's functions stubbed: header figures become the stored section."""
    hub = pytest.importorskip("huggingface_hub")
    from huggingface_hub.utils import SafetensorsFileMetadata, SafetensorsRepoMetadata, TensorInfo
    from safetensors.numpy import save_file

    st = write_config(tmp_path, TINY) / "model.safetensors"
    save_file(tiny_tensors(), str(st))
    n, size = header_length(st), st.stat().st_size
    header = json.loads(st.read_bytes()[8 : 8 + n])
    header.pop("__metadata__", None)
    tensors = {
        k: TensorInfo(dtype=v["dtype"], shape=v["shape"], data_offsets=tuple(v["data_offsets"]))
        for k, v in header.items()
    }
    meta = SafetensorsRepoMetadata(
        metadata=None,
        sharded=False,
        weight_map={k: st.name for k in tensors},
        files_metadata={st.name: SafetensorsFileMetadata({}, tensors)},
    )

    class PathInfo:  # what get_paths_info returns: path and size
        path = st.name

    PathInfo.size = size
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # no request: config.json from the (stubbed) cache
    monkeypatch.setattr(hub, "hf_hub_download", lambda repo, name, **kw: str(tmp_path / name))
    monkeypatch.setattr(hub, "get_safetensors_metadata", lambda repo: meta)
    monkeypatch.setattr(hub, "get_paths_info", lambda repo, paths: [PathInfo()])
    r = count("someone/tiny-qwen3")
    assert r.source == "hub" and r.total == TINY_TOTAL
    assert r.stored["parameters"] == TINY_TOTAL + 6_400
    assert r.stored["file_bytes"] == size and r.stored["header_bytes"] == 8 + n


# ---- the command line ------------------------------------------------------------------------------------


def test_cli_table_is_aligned():
    p = run_cli(LLAMA_8B)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    table = lines[lines.index(next(x for x in lines if x.startswith("embedding table"))) :]
    table = table[: next(i for i, x in enumerate(table) if x.startswith("TOTAL")) + 1]
    numbered = [x for x in table if "=" in x]
    assert len({x.index("=") for x in numbered}) == 1 and len({len(x) for x in numbered}) == 1
    assert table[-1].endswith("= 8,030,261,248")
    assert any(x.startswith("32 layers") and x.endswith("6,979,584,000") for x in table)
    assert "16,060,522,496" in p.stdout and "15,009,849,344" in p.stdout and "524,288" in p.stdout


def test_cli_json_has_every_figure():
    p = run_cli(
        LLAMA_8B, "--context", 12060, "--answer-tokens", 300, "--flops", "989T", "--bandwidth", "3.35TB/s", "--json"
    )
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d == json.loads(
        json.dumps(count(LLAMA_8B, context=12060, answer_tokens=300, flops="989T", bandwidth="3.35TB/s").to_dict())
    )
    assert d["total"] == 8_030_261_248 and d["context"]["attention_ops"] == 6_322_913_280
    assert d["hardware"]["binds"] == "memory"


@pytest.mark.slow
def test_count_imports_no_framework():
    """Neither the API nor the command imports mlx, mlx-lm, transformers (nor numpy, nor torch)."""
    heavy = "{'mlx', 'mlx_lm', 'transformers', 'torch', 'numpy'}"
    check = f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {heavy}); assert not bad, bad"
    counts = f"count({str(QWEN3_06B)!r}); count({str(CONFIGS / 'qwen3-30b-a3b.json')!r}); count(None)"  # MoE too
    api = f"import sys; from mlxinfer.counting import count; {counts}; {check}"
    cli = (
        f"import sys; sys.argv = ['mlxinfer', 'count', {str(LLAMA_8B)!r}, '--context', '100']\n"
        "from mlxinfer_cli.app import main\ntry:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        + check.replace("'numpy'", "'mlx'")
    )  # numpy: only the API is held to it
    for code in (api, cli):
        p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr


def test_cli_errors(tmp_path):
    missing = dict(TINY)
    del missing["hidden_size"]
    assert_one_line_error(run_cli(write_config(tmp_path / "missing", missing)), "hidden_size")
    (tmp_path / "notjson.json").write_text("{not json")
    assert_one_line_error(run_cli(tmp_path / "notjson.json"), "not valid JSON")
    corrupt = write_config(tmp_path / "corrupt", TINY) / "model.safetensors"
    corrupt.write_bytes(struct.pack("<Q", 10**12) + b"{}")
    assert_one_line_error(run_cli(corrupt.parent), "corrupt safetensors header")
    corrupt.write_bytes(struct.pack("<Q", 5) + b"{oops")
    assert_one_line_error(run_cli(corrupt.parent), "corrupt safetensors header")
    (tmp_path / "bad.gguf").write_bytes(b"GGML" + bytes(64))
    assert_one_line_error(run_cli(tmp_path / "bad.gguf"), "bad magic")
    assert_one_line_error(run_cli(LLAMA_8B, "--context", -5), "context")
    assert_one_line_error(run_cli(LLAMA_8B, "--answer-tokens", 300), "--context")
    assert_one_line_error(run_cli(LLAMA_8B, "--bandwidth", "fast"), "bandwidth")
    assert_one_line_error(run_cli(tmp_path / "nowhere" / "config.json"), "no model at")


def mlxinfer_with_hub(tmp_path, args: list, timeout: int, **hub_env) -> subprocess.CompletedProcess:
    """`python -m mlxinfer ARGS` in a process of its own (huggingface_hub reads HF_HOME when it is first
    imported), with an empty hub cache under tmp_path and hub_env's variables, no other cache or offline flag."""
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf"), **hub_env)
    for name in {"HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"} - set(hub_env):
        env.pop(name, None)
    run = [sys.executable, "-m", "mlxinfer", *args]
    return subprocess.run(run, cwd=REPO, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.slow
def test_cli_hub_offline(tmp_path):
    p = mlxinfer_with_hub(tmp_path, ["count", "Qwen/Qwen3-0.6B"], 120, HF_HUB_OFFLINE="1")
    assert_one_line_error(p, "Qwen/Qwen3-0.6B", "HF_HUB_OFFLINE")


@pytest.mark.slow
@pytest.mark.parametrize("command", [["count"], ["topk", "-p", "hi", "-m"]])
def test_cli_hub_out_of_reach(tmp_path, command):
    """No HF_HUB_OFFLINE, a hub that does not resolve: one line at once, not huggingface_hub's ~23 s of
    logged retries (count) or an HTTP library's traceback (count read the safetensors headers first)."""
    p = mlxinfer_with_hub(tmp_path, [*command, "Qwen/Qwen3-0.6B"], 60, HF_ENDPOINT="http://hub.invalid")
    assert_one_line_error(p, "Qwen/Qwen3-0.6B", "cannot be reached")


def test_a_gguf_read_as_float32_reads_four_bytes_a_parameter():
    """Was: count embedded@float32 said its header was dequantized yet gave the 4-bit bytes read per token
    (96,576,768) and 'loads exact 4-bit g32' for every quantized type."""
    stored, wide = count("embedded"), count("embedded@float32")
    assert wide.total == stored.total == 134_515_008
    assert wide.operations["weight_bytes_read_per_token"] == 4 * wide.total  # tied: the one table is read once
    assert stored.operations["weight_bytes_read_per_token"] == stored.quantization["bytes"]
    loads = {t: d["loads_as"] for t, d in wide.quantization["types"].items()}
    assert loads == {"Q4_1": "as float32 (dequantized)", "Q8_0": "as float32 (dequantized)", "F32": "as stored"}


def test_a_context_past_a_trillion_tokens_is_refused():
    """Was: --context 99999999999999999999 printed 'about 6912000000000 trillion' operations."""
    with pytest.raises(MlxinferError, match="from 1 to 1,000,000,000,000"):
        count("embedded", context=10**20)


def test_a_mixture_whose_layers_are_all_dense_counts_as_the_dense_model(tmp_path):
    """Qwen3-MoE with every layer in mlp_only_layers (or a sparse step past the last layer) runs dense MLPs
    of intermediate_size: the same count as Qwen3 with that config, and a note that says why."""
    cfg = json.loads((CONFIGS / "qwen3-30b-a3b.json").read_text())
    dense = {k: v for k, v in cfg.items() if k not in ("num_experts", "num_experts_per_tok", "moe_intermediate_size")}
    dense.update(model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    (tmp_path / "dense.json").write_text(json.dumps(dense))
    want = count(tmp_path / "dense.json")
    for change in ({"mlp_only_layers": list(range(cfg["num_hidden_layers"]))}, {"decoder_sparse_step": 1000}):
        (tmp_path / "moe.json").write_text(json.dumps({**cfg, **change}))
        got = count(tmp_path / "moe.json")
        assert (got.total, got.operations) == (want.total, want.operations), change
        assert not got.experts and any("no layer has experts" in n for n in got.notes), got.notes


def test_another_librarys_quantization_is_priced_as_its_float_type_and_said_so(tmp_path):
    """GPTQ's quantization_config has bits and group_size too; it was priced as MLX's affine layout. Now the
    bytes are the float config's, with a note naming the method."""
    cfg = json.loads((CONFIGS / "qwen3-1.7b.json").read_text())
    want = count(write_config(tmp_path / "float", cfg))
    gptq = {**cfg, "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    got = count(write_config(tmp_path / "gptq", gptq))
    assert (got.total, got.bytes, got.quantization) == (want.total, want.bytes, want.quantization)
    assert any("'gptq', not MLX's layout" in n for n in got.notes), got.notes


def test_a_context_past_a_default_max_position_embeddings_says_it_was_not_in_the_file(tmp_path):
    """A config.json without max_position_embeddings: `count` warned 'beyond the model's max_position_embeddings
    (2,048)' as if the file said 2,048 (Llama 3.1 8B takes 131,072). The note now says the value is the
    architecture's default, and the JSON says whether the file gave it."""
    config = {k: v for k, v in json.loads(LLAMA_8B.read_text()).items() if k != "max_position_embeddings"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    r = count(str(tmp_path / "config.json"), context=12_060)
    assert r.context["beyond_max_context"] and r.context["max_context_given"] is False
    shown = run_cli(tmp_path / "config.json", "--context", 12_060)
    assert "max_position_embeddings (2,048, the architecture's default: config.json does not set it)" in shown.stdout
    given = dict(config, max_position_embeddings=8_192)
    (tmp_path / "config.json").write_text(json.dumps(given))
    shown = run_cli(tmp_path / "config.json", "--context", 12_060)
    assert "max_position_embeddings (8,192)\n" in shown.stdout
    assert count(str(tmp_path / "config.json"), context=12_060).context["max_context_given"] is True


def test_a_whole_answers_time_shows_only_the_bounds_whose_rate_was_given():
    """--flops alone printed 'whole answer, memory-bound' with an empty value."""
    shown = run_cli(LLAMA_8B, "--context", 12_060, "--answer-tokens", 300, "--flops", "989T")
    assert "whole answer, compute-bound" in shown.stdout and "memory-bound" not in shown.stdout
    shown = run_cli(LLAMA_8B, "--context", 12_060, "--answer-tokens", 300, "--bandwidth", "3.35TB/s")
    assert "whole answer, memory-bound" in shown.stdout and "compute-bound" not in shown.stdout


def test_a_layer_mlx_lm_left_in_float_by_a_predicate_is_priced_as_float(tmp_path):
    """mlx-lm's convert with a quant_predicate that skips a layer writes no config entry for it; its loader
    reads a matrix stored without scales as float. count priced q_proj and the embedding as 4-bit: 945,664
    bytes predicted for a folder of 1,275,392. The oracle: the safetensors headers' own byte counts."""
    import contextlib
    import io

    import checkpoints
    from mlx_lm.convert import convert

    src = checkpoints.write_checkpoint(tmp_path / "hf", "llama")

    def predicate(path, module):  # q_proj and the embedding in float, down_proj 8-bit, the rest 4-bit
        if "down_proj" in path:
            return {"bits": 8, "group_size": 64, "mode": "affine"}
        return not ("q_proj" in path or "embed_tokens" in path)

    out = tmp_path / "mixed"
    with contextlib.redirect_stdout(io.StringIO()):
        convert(str(src), str(out), quantize=True, q_bits=4, q_group_size=64, quant_predicate=predicate)
    report = json.loads(invoke_cli("count", str(out), "--json").stdout)
    assert report["quantization"]["bytes"] == report["stored"]["tensor_bytes"], report["stored"]["notes"]
    assert report["quantization"]["float_parameters"] > report["embedding"]  # the embedding and every q_proj
    # and the model, loaded as stored, names both widths (a mixed folder read as one: "6-bit" for mixed_3_6)
    import mlxinfer

    model, _ = mlxinfer.load(out, compute_dtype="bfloat16")
    assert model.info.weights.startswith("4/8-bit quantized"), model.info.weights


def test_nvfp4s_group_of_16_is_read_and_its_mode_named():
    """Was: "'quantization' needs ... group_size in (32, 64, 128)" for a valid nvfp4 block (group 16), where
    the reason it does not load is the mode."""
    from mlxinfer.formats.config import ModelConfig

    import checkpoints

    cfg = {
        **checkpoints.BASE,
        **checkpoints.ARCHS["llama"],
        "quantization": {"bits": 4, "group_size": 16, "mode": "nvfp4"},
    }
    assert ModelConfig.from_dict(cfg).quantization["mode"] == "nvfp4"


def test_sliding_window_layers_stop_growing_past_their_window():
    """Gemma 3 1B: 22 of its 26 layers attend to the last 512 tokens only (mlx-lm's rule: layer i is global
    where (i + 1) % 6 == 0, the others keep a rotating cache of 512). count took every layer as global: at
    32,768 tokens 3,489,660,928 attention operations, and attention catching up with the weights at 18,778
    tokens, where it never does within the model's context."""
    cfg = json.loads((CONFIGS / "gemma-3-1b-it.json").read_text())
    r = count(str(CONFIGS / "gemma-3-1b-it.json"), context=32768, answer_tokens=100)
    per = 2 * 2 * cfg["num_attention_heads"] * cfg["head_dim"]
    globals_ = [i for i in range(26) if (i + 1) % 6 == 0]
    assert len(globals_) == 4 and r.operations["windowed_layers"] == 22
    assert r.context["attention_ops"] == per * (4 * 32768 + 22 * 512) == 583_008_256
    kv_layer = 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * r.bytes_per_parameter
    assert r.context["kv_cache_bytes"] == kv_layer * (4 * 32768 + 22 * 512)
    by_pass = sum(4 * (32768 + k) + 22 * 512 for k in range(100))  # each pass's layer-tokens, added up
    assert r.answer["attention_ops"] == per * by_pass
    n = r.operations["crossover_context"]  # where 4 growing layers plus 22 capped ones reach the weights
    assert per * (4 * n + 22 * 512) == pytest.approx(r.operations["weights_per_token"])
    llama = count(str(CONFIGS / "llama-3.1-8b.json"), context=1000)
    assert llama.operations["windowed_layers"] == 0 and llama.context["attention_ops"] == 524_288 * 1000
    # a window mlx-lm's class does not apply counts as the whole context: Qwen2's layer_types, unused
    qwen = json.loads((CONFIGS / "qwen2.5-0.5b.json").read_text())
    qwen.update(use_sliding_window=True, layer_types=["sliding_attention"] * qwen["num_hidden_layers"])
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(qwen))
        assert count(str(Path(d) / "config.json"), context=32768).operations["windowed_layers"] == 0


def test_a_qwen3_config_without_head_dim_takes_hugging_faces_default():
    """Qwen3Config's head_dim defaults to 128, not hidden / heads (64 for the 0.6B's shape): count gave
    507,965,952 for the lesson's Qwen3-0.6B with head_dim left out, where Hugging Face builds 596,049,920."""
    import tempfile

    cfg = json.loads((CONFIGS / "qwen3-0.6b.json").read_text())
    assert cfg.pop("head_dim") == 128 and cfg["hidden_size"] // cfg["num_attention_heads"] == 64
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "config.json").write_text(json.dumps(cfg))
        assert count(str(Path(d) / "config.json")).total == 596_049_920
