"""Architectures beyond model.py's own, run by mlx-lm's own classes (and Qwen3-MoE by ours): tiny
random checkpoints written with mlx-lm's class for each (tests/checkpoints.py), in the mlx-community
layout, bf16 and 4-bit, driven through every command."""

from __future__ import annotations

import json
import math
from pathlib import Path

import mlxinfer  # first: it loads a fast BLAS before anything imports mlx

import jsonschema
import mlx.core as mx
import pytest
from conftest import ROOT, assert_one_line_error, invoke_cli

import checkpoints
from mlxinfer.formats.architectures import ARCHITECTURES, GGUF

ARCHS = list(checkpoints.MLX_LM_ARCHS)  # gemma3_text, mistral, phi3, mixtral, olmo2, qwen3_moe
MOE = {"mixtral", "qwen3_moe"}
DEFINITION = {
    "gemma3_text": "mlx-lm gemma3_text",
    "mistral": "mlx-lm llama (mistral)",  # mlx-lm runs Mistral on its Llama class
    "phi3": "mlx-lm phi3",
    "mixtral": "mlx-lm mixtral",
    "olmo2": "mlx-lm olmo2",
    "qwen3_moe": "mlxinfer qwen3_moe",  # our own definition
}
# the lesson's tool with bounds (short names, whole quantities under 100, three items at most): greedy
# decoding of a random model otherwise loops inside a string or a number until max_tokens cuts it
_tool = json.loads((ROOT / "examples" / "add_to_shopping_list.json").read_text())
_items = _tool["input_schema"]["properties"]["items"]
_items["maxItems"] = 3
_items["items"]["properties"]["name"]["maxLength"] = 12
_items["items"]["properties"]["quantity"] = {"type": "integer", "minimum": 1, "maximum": 99}
TOOL = json.dumps(_tool)
PROMPT = "Name one herb to add to tomato soup. Answer with one word."
# 40 positions: past Gemma's sliding window of 8, and 80 (token, expert) rows: the experts' sorted path
IDS = mx.array([[1, 17, 42, 99, 250, 3, 7, 120, 64, 2, 33, 180, 5, 9, 11, 300, 21, 77, 150, 260] * 2])
ON_CPU = mx.default_device().type == mx.DeviceType.cpu


def max_abs_diff(a: mx.array, b: mx.array) -> float:
    return mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max().item()


@pytest.mark.parametrize("variant", ["bf16", "4bit"])
@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "qwen3_moe"])  # ours: test_moe.py's parity check
def test_logits_equal_mlx_lm_load(mlx_lm_dir, arch, variant):
    """Loaded by mlxinfer (mlx-lm's class with our loaders): mlx_lm.load's logits exactly.

    MLX's CPU gather matmul computes only in float32, so on the CPU bf16 experts are upcast on load (and
    mlx-lm's model cannot run them as stored); its model gets the same upcast for the comparison."""
    import mlx_lm

    from mlxinfer.model.convert import experts_to_float32_on_cpu

    path = mlx_lm_dir(arch, variant)
    model, _ = mlxinfer.load(path, compute_dtype="bfloat16")
    assert model.info.definition == DEFINITION[arch]
    assert model.info.weights.startswith("4-bit" if variant == "4bit" else "bfloat16")
    peer, _ = mlx_lm.load(str(path))
    upcast = experts_to_float32_on_cpu(peer)
    assert upcast == (arch in MOE and variant == "bf16" and ON_CPU)
    assert ("experts float32" in model.info.weights) == upcast
    assert max_abs_diff(model(IDS), peer(IDS)) == 0.0


@pytest.mark.parametrize("arch", ["gemma3_text", "mixtral", "phi3"])
def test_kv_cache_steps_equal_a_full_pass(mlx_lm_dir, arch):
    """The engine's cache for mlx-lm's classes (Gemma 3: a rotating cache for its sliding layers)."""
    model, _ = mlxinfer.load(mlx_lm_dir(arch, "4bit"), compute_dtype="bfloat16")
    full = model(IDS)[0]
    cache = model.make_cache()
    model(IDS[:, :12], cache=cache)
    for n in range(12, IDS.shape[1]):
        assert max_abs_diff(model(IDS[:, n : n + 1], cache=cache)[0, -1], full[n]) < 0.05, n  # bf16 activations


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["bf16", "4bit"])
@pytest.mark.parametrize("arch", ARCHS)
def test_every_command_runs_and_says_which_definition(mlx_lm_dir, arch, variant):
    path = str(mlx_lm_dir(arch, variant))
    top = invoke_cli("topk", "-m", path, "-p", PROMPT, "--rows", "5", "--explain", "--json")
    assert top.returncode == 0, top.stderr
    table = json.loads(top.stdout)
    assert table["definition"] == DEFINITION[arch] and table["n_scores"] == checkpoints.BASE["vocab_size"]
    assert len(table["rows"]) == 5 and table["explanation"]["n_kept"] >= 1
    assert (table["routing"] is not None) == (arch == "qwen3_moe")  # only our own definition shows its router
    text = invoke_cli("topk", "-m", path, "-p", PROMPT)
    assert (
        text.returncode == 0
        and f"scores in one pass of {DEFINITION[arch]} on {table['weights']} weights: 384" in text.stdout
    )

    greedy = invoke_cli("generate", "-m", path, "-p", PROMPT, "--temp", "0", "--max-tokens", "6", "--json")
    assert greedy.returncode == 0, greedy.stderr
    g = json.loads(greedy.stdout)
    assert g["definition"] == DEFINITION[arch] and g["settings"]["temperature"] == 0.0
    assert 1 <= len(g["tokens"]) <= 6 or g["finish_reason"] == "stop"

    call = invoke_cli("generate", "-m", path, "-p", PROMPT, "--tool", TOOL, "--temp", "0", "--max-tokens", "200")
    assert call.returncode == 0, call.stderr
    assert DEFINITION[arch] in call.stderr.splitlines()[0]
    jsonschema.validate(json.loads(call.stdout), json.loads(TOOL)["input_schema"])

    sample = invoke_cli("sample", "-m", path, "-p", PROMPT, "--seeds", "4", "--temp", "1", "--json")
    assert sample.returncode == 0, sample.stderr
    s = json.loads(sample.stdout)
    assert s["definition"] == DEFINITION[arch] and [c["seed"] for c in s["completions"]] == [0, 1, 2, 3]
    assert sum(t["count"] for t in s["tally"]) == 4


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["4bit-f32", "bf16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_float32_path_gives_the_as_stored_greedy_tokens(mlx_lm_dir, arch, variant):
    """The float32 path dequantizes any module tree (mlx-lm's stacked experts too) into the same model.

    4bit-f32 is mlx-lm's 4-bit convert with float32 scales: both paths compute in float32, differ only in
    summation order, and give the same greedy tokens. bf16 as stored computes in bf16, whose rounding moves
    a random tiny model's flat scores by up to ~0.05 while its top two can tie: there, along the as-stored
    greedy tokens, every step's scores agree within 0.1 and the top token is the same wherever it leads by
    more than 0.2. (A mixture of experts in bf16 also flips its random router's near-ties, which moves
    whole expert outputs: for those the 4bit-f32 case is the comparison.)"""
    if arch in MOE and variant == "bf16":
        pytest.skip("bf16 rounding flips a random router's near-tied experts; 4bit-f32 compares the MoE paths")
    path = mlx_lm_dir(arch, variant)
    stored, tok = mlxinfer.load(path, compute_dtype="bfloat16")
    fast, _ = mlxinfer.load(path, compute_dtype="float32")
    assert fast.info.weights == "float32" and stored.info.weights != "float32"
    a = mlxinfer.generate(stored, tok, PROMPT, settings=mlxinfer.GREEDY, max_tokens=12)
    if variant == "4bit-f32":
        b = mlxinfer.generate(fast, tok, PROMPT, settings=mlxinfer.GREEDY, max_tokens=12)
        assert a.tokens == b.tokens and len(a.tokens) >= 1
        return
    ids, n = mx.array([a.prompt_ids + a.tokens]), len(a.prompt_ids)
    s, f = stored(ids)[0, n - 1 : -1].astype(mx.float32), fast(ids)[0, n - 1 : -1]  # the scores for each token
    assert max_abs_diff(s, f) < 0.1
    top2 = mx.sort(s, axis=-1)[:, -2:]
    clear = (top2[:, 1] - top2[:, 0]) > 0.2
    assert mx.all(mx.where(clear, mx.argmax(f, -1) == mx.array(a.tokens), True)).item()
    assert mx.sum(clear).item() >= len(a.tokens) // 2  # most steps are clear: the check has teeth


# ---- count: the formula against mlx-lm's class, the header count where there is no formula -------------


def mlx_lm_total(cfg: dict, stored_names: set[str] | None = None) -> int:
    """Parameters of mlx-lm's model for this config, instantiated lazily (nothing is materialised)."""
    from mlx.utils import tree_flatten

    model = checkpoints.mlx_lm_model(cfg)
    if hasattr(model, "sanitize") and cfg["model_type"] == "gemma3_text":
        model.sanitize({n: None for n in stored_names or ()})  # Gemma 3 ties when no lm_head is stored
    return sum(math.prod(p.shape) for _, p in tree_flatten(model.parameters()))


@pytest.mark.parametrize("arch", ARCHS)
def test_count_equals_mlx_lms_parameters_tiny(mlx_lm_dir, arch):
    path = mlx_lm_dir(arch)
    cfg = json.loads((path / "config.json").read_text())
    report = mlxinfer.count(path)
    assert report.total == mlx_lm_total(cfg)
    stored = report.stored
    assert stored["parameters"] == report.total and not stored["extra"] and not stored["missing"]
    if arch == "olmo2":  # no formula: counted from the headers, and said so
        assert report.notes[0].startswith("count has no formula for model_type 'olmo2'")
    else:
        assert "every parameter is stored exactly once" in stored["notes"]
    q = mlxinfer.count(mlx_lm_dir(arch, "4bit"))
    assert q.total == report.total and q.quantization["bits"] == 4  # packed weights counted unpacked
    assert q.quantization["bytes"] == q.stored["tensor_bytes"]  # predicted bytes = what convert wrote


CONFIGS = ROOT / "tests" / "fixtures" / "configs"


@pytest.mark.parametrize(
    "name", ["qwen3-30b-a3b", "mixtral-8x7b", "gemma-3-1b-it", "mistral-7b-v0.3", "phi-3-mini-4k-instruct"]
)
def test_count_equals_mlx_lms_parameters_published(name):
    path = CONFIGS / f"{name}.json"
    cfg = json.loads(path.read_text())
    assert mlxinfer.count(path).total == mlx_lm_total(cfg)  # gemma-3-1b stores no lm_head: tied


@pytest.mark.parametrize(
    "name,total,active",
    [("qwen3-30b-a3b", 30.5, 3.3), ("mixtral-8x7b", 46.7, 12.9)],  # the model cards, in billions
)
def test_active_parameters_agree_with_the_model_cards(name, total, active):
    r = mlxinfer.count(CONFIGS / f"{name}.json")
    assert abs(r.total / 1e9 - total) < 0.1 and abs(r.experts["active"] / 1e9 - active) < 0.1
    e = r.experts
    assert e["active"] == r.total - e["experts_total"] + e["experts_active"]
    assert e["experts_active"] * e["num_experts"] == e["experts_total"] * e["experts_per_token"]
    tied_extra = 0  # both untied: the output matmul is the output table itself
    assert r.operations["weights_per_token"] == 2 * (e["active"] - r.embedding + tied_extra)


def test_count_without_a_formula_needs_the_files(mlx_lm_dir, tmp_path):
    config = tmp_path / "olmo2.json"
    config.write_text((mlx_lm_dir("olmo2") / "config.json").read_text())
    assert_one_line_error(invoke_cli("count", str(config)), "no formula", "olmo2", "safetensors")


# ---- the description's names in other layouts, against the projects that own them ---------------------------


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_names_match_hugging_face_mlx_lm_and_llama_cpp(model_type):
    """hf_class is transformers' causal-LM class for the type, mlx_lm the module mlx-lm's loader picks
    (its MODEL_REMAPPING: Mistral runs on llama), gguf the architecture name gguf-py writes."""
    import importlib

    import gguf
    from mlx_lm.utils import MODEL_REMAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    a = ARCHITECTURES[model_type]
    assert a.hf_class == MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    assert a.mlx_lm == MODEL_REMAPPING.get(model_type, model_type)
    assert hasattr(importlib.import_module(f"mlx_lm.models.{a.mlx_lm}"), "Model")
    if a.gguf:
        assert gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH[model_type.upper()]] == a.gguf
        assert a.ours  # a GGUF file loads on our definition only


def test_gguf_loads_exactly_the_architectures_with_a_gguf_name():
    """The loader's list of GGUF architectures is the description's: an unknown one is refused by name."""
    from mlxinfer.formats import gguf as ours
    from mlxinfer.formats import sources

    assert sorted(GGUF) == ["llama", "qwen2", "qwen3"]
    header = ours.read_header(sources.resolve(None).path, tokenizer=False)  # the embedded model: llama
    assert ours.config_from_header(header).model_type == GGUF[header.architecture] == "llama"
    header.metadata["general.architecture"] = "gemma3"
    with pytest.raises(mlxinfer.MlxinferError, match="unknown architecture 'gemma3'.*llama, qwen2, qwen3"):
        ours.config_from_header(header)


# ---- bad input ---------------------------------------------------------------------------------------------


def _copy(src: Path, dst: Path, **config) -> Path:
    import shutil

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**cfg, **config}))
    return dst


def test_unknown_model_type_is_one_line(mlx_lm_dir, tmp_path):
    bad = _copy(mlx_lm_dir("mistral"), tmp_path / "bad", model_type="gpt_unknown")
    assert_one_line_error(invoke_cli("topk", "-m", str(bad), "-p", "hi"), "unknown architecture", "gpt_unknown")
    counted = mlxinfer.count(bad)  # count still reads the files: no formula, so their headers
    assert counted.notes[0].startswith("count has no formula for model_type 'gpt_unknown'")
    assert counted.total == mlxinfer.count(mlx_lm_dir("mistral")).total


def test_a_config_asking_for_its_own_code_is_refused(mlx_lm_dir, tmp_path):
    """mlx-lm runs a repository's model_file only with trust_remote_code; mlxinfer never does."""
    bad = _copy(mlx_lm_dir("mistral"), tmp_path / "custom", model_file="modeling_custom.py")
    (bad / "modeling_custom.py").write_text("raise SystemExit('this must never run')\n")
    assert_one_line_error(invoke_cli("topk", "-m", str(bad), "-p", "hi"), "modeling_custom.py", "never runs code")


def test_weights_that_do_not_match_the_class_name_the_first_tensor(mlx_lm_dir, tmp_path):
    # Mistral's weights under Phi-3's class: separate q/k/v where Phi-3 has one qkv_proj
    bad = _copy(mlx_lm_dir("mistral"), tmp_path / "bad", model_type="phi3")
    assert_one_line_error(
        invoke_cli("topk", "-m", str(bad), "-p", "hi"), "model.layers.0.mlp.gate_up_proj.weight", "lacks"
    )
    wide = _copy(mlx_lm_dir("gemma3_text"), tmp_path / "wide", intermediate_size=320)
    assert_one_line_error(
        invoke_cli("topk", "-m", str(wide), "-p", "hi"), "model.layers.0.mlp.gate_proj.weight", "shape"
    )


# ---- quantize, quality and bench on mlx-lm's classes ------------------------------------------------------


@pytest.mark.parametrize("arch", ["gemma3_text", "mixtral", "phi3"])
def test_quantize_writes_mlx_lms_convert(mlx_lm_dir, tmp_path, arch):
    """The same tensors and config block as mlx-lm's convert, mixtral's stacked experts included."""
    from mlxinfer_quant import quantize

    quantize(mlx_lm_dir(arch), tmp_path / "ours", bits=4, group_size=64)
    ours = mx.load(str(tmp_path / "ours" / "model.safetensors"))
    peer = mx.load(str(mlx_lm_dir(arch, "4bit") / "model.safetensors"))
    assert sorted(ours) == sorted(peer)
    for name in ours:
        assert mx.array_equal(ours[name], peer[name]).item(), name
    model, _ = mlxinfer.load(tmp_path / "ours", compute_dtype="bfloat16")
    assert model.info.definition == DEFINITION[arch] and model.info.weights.startswith("4-bit")


@pytest.mark.slow
def test_quality_report_on_mlx_lms_class(mlx_lm_dir):
    from mlxinfer_quant import evaluate

    report = evaluate(mlx_lm_dir("phi3"), [mlx_lm_dir("phi3", "4bit")], max_tokens=64)
    ref, q4 = report.reference, report.candidates[0]
    assert report.positions == 63 and ref.parameters == q4.parameters
    assert q4.kl_mean > 0 and 0 <= q4.top1_agreement <= 1 and q4.bytes < ref.bytes
    assert math.isfinite(ref.perplexity) and math.isfinite(q4.perplexity)


@pytest.mark.slow
def test_bench_on_mlx_lms_class(mlx_lm_dir):
    """mlx-lm's class is its own twin: its generate_step, our loop, our float32 path; same greedy tokens
    (4-bit weights with float32 scales, so that all three compute in float32)."""
    from mlxinfer.engine.bench import run_bench

    report = run_bench(
        str(mlx_lm_dir("mixtral", "4bit-f32")), prompt_tokens=(6,), gen_tokens=4, repeats=1, bandwidth_gb_s=10.0
    )
    assert {r.engine for r in report.rows} == {"mlx-lm", "mlxinfer", "mlxinfer float32"}
    assert all(r.same_tokens for r in report.rows), report.rows


# ---- the forward-pass notebook -----------------------------------------------------------------------------


def _notebook_code() -> list[str]:
    nb = json.loads((ROOT / "notebooks" / "forward_pass.ipynb").read_text())
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    return ["\n".join(line for line in c.splitlines() if not line.startswith("%")) for c in cells]  # no magics


def test_forward_pass_notebook_says_plainly_it_needs_our_definition(mlx_lm_dir, monkeypatch):
    pytest.importorskip("matplotlib", reason="pip install -e '.[notebooks]'")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    code = _notebook_code()
    scope: dict = {}
    exec(code[0], scope)
    scope["MODEL"] = str(mlx_lm_dir("gemma3_text"))
    with pytest.raises(SystemExit, match=r"runs on mlx-lm gemma3_text, not on mlxinfer's own definition"):
        exec(code[1], scope)


@pytest.mark.slow
def test_forward_pass_notebook_runs_on_our_qwen3_moe(mlx_lm_dir, monkeypatch, tmp_path, capsys):
    """Every stage, on our own mixture-of-experts definition, with the router's choices shown."""
    pytest.importorskip("matplotlib", reason="pip install -e '.[notebooks]'")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("MLXINFER_IMAGES", str(tmp_path))
    code = _notebook_code()
    scope: dict = {}
    exec(code[0], scope)
    scope["MODEL"] = str(mlx_lm_dir("qwen3_moe", "4bit"))
    for cell in code[1:]:
        exec(cell, scope)
    assert "2 of 8 experts per layer; the router's choice for" in capsys.readouterr().out
    assert (tmp_path / "forward_pass.png").is_file()
