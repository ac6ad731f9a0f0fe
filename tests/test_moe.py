"""Our Qwen3-MoE definition (model/moe.py) against mlx-lm's qwen3_moe class: the same logits to the
bit, the router's choices, Hugging Face's per-expert layout, and quantization as mlx-lm's convert does it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlxinfer  # first: it loads a fast BLAS before anything imports mlx

import mlx.core as mx
import pytest
from conftest import assert_one_line_error, invoke_cli

import checkpoints

LONG = mx.array([[1, 17, 42, 99, 250, 3, 7, 120, 64, 2, 33, 180, 5, 9, 11, 300, 21, 77, 150, 260] * 2])  # 80 rows
SHORT = LONG[:, :5]  # 10 (token, expert) rows: below 64, the experts run unsorted
ON_CPU = mx.default_device().type == mx.DeviceType.cpu


def max_abs_diff(a: mx.array, b: mx.array) -> float:
    return mx.abs(a.astype(mx.float32) - b.astype(mx.float32)).max().item()


def float32_copy(src: Path, out: Path, rename=None) -> Path:
    """The same checkpoint with every tensor upcast to float32 (exactly: bf16 -> f32 loses nothing)."""
    shutil.copytree(src, out)
    weights = mx.load(str(src / "model.safetensors"))
    weights = {k: v.astype(mx.float32) for k, v in weights.items()}
    if rename:
        weights = rename(weights)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})
    cfg = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**cfg, "torch_dtype": "float32"}))
    return out


def per_expert(weights: dict) -> dict:
    """mlx-community's stacked experts back into Hugging Face's one tensor per expert."""
    out = {}
    for name, value in weights.items():
        if ".switch_mlp." not in name:
            out[name] = value
            continue
        stem, proj_part = name.split(".switch_mlp.")
        for e in range(value.shape[0]):
            out[f"{stem}.experts.{e}.{proj_part}"] = value[e]
    return out


@pytest.fixture(scope="module")
def f32(mlx_lm_dir, tmp_path_factory):
    return float32_copy(mlx_lm_dir("qwen3_moe"), tmp_path_factory.mktemp("moe") / "f32")


@pytest.mark.parametrize("ids", [LONG, SHORT], ids=["sorted-experts", "unsorted-experts"])
@pytest.mark.parametrize("variant", ["4bit", "bf16-as-float32", "bf16"])
def test_logits_equal_mlx_lm_exactly(mlx_lm_dir, f32, variant, ids):
    """Loaded by mlxinfer (our own definition): mlx_lm.load's logits exactly (the one MoE parity check;
    test_architectures' covers the other classes). MLX's CPU gather matmul computes only in float32, so on
    the CPU bf16 experts are upcast on load (and mlx-lm's model cannot run them as stored); its model
    gets the same upcast for the comparison. bf16-as-float32 runs the same weights upcast in the file."""
    import mlx_lm

    from mlxinfer.model.convert import experts_to_float32_on_cpu

    path = f32 if variant == "bf16-as-float32" else mlx_lm_dir("qwen3_moe", variant)
    ours, _ = mlxinfer.load(path, compute_dtype="bfloat16")  # as stored
    assert ours.info.definition == "mlxinfer qwen3_moe"
    assert ours.info.weights.startswith({"4bit": "4", "bf16": "bfloat16", "bf16-as-float32": "float32"}[variant])
    peer, _ = mlx_lm.load(str(path))
    assert type(peer).__module__ == "mlx_lm.models.qwen3_moe"
    upcast = experts_to_float32_on_cpu(peer)
    assert upcast == (variant == "bf16" and ON_CPU)
    assert ("experts float32" in ours.info.weights) == upcast
    assert max_abs_diff(ours(ids), peer(ids)) == 0.0


def test_cached_steps_equal_mlx_lms_exactly(mlx_lm_dir):
    import mlx_lm
    from mlx_lm.models.cache import make_prompt_cache

    path = mlx_lm_dir("qwen3_moe", "4bit")
    ours, _ = mlxinfer.load(path, compute_dtype="bfloat16")
    peer, _ = mlx_lm.load(str(path))
    a, b = ours.make_cache(), make_prompt_cache(peer)
    assert max_abs_diff(ours(LONG[:, :30], cache=a), peer(LONG[:, :30], cache=b)) == 0.0  # prefill, sorted
    for n in range(30, 36):  # one token at a time, unsorted
        assert max_abs_diff(ours(LONG[:, n : n + 1], cache=a), peer(LONG[:, n : n + 1], cache=b)) == 0.0, n


def test_the_twin_is_mlx_lms_class_with_our_tensors(mlx_lm_dir):
    import mlx_lm

    from mlxinfer.model.peers import mlx_lm_twin

    path = mlx_lm_dir("qwen3_moe", "4bit")
    ours, _ = mlxinfer.load(path, compute_dtype="bfloat16")
    twin = mlx_lm_twin(ours)
    assert type(twin).__module__ == "mlx_lm.models.qwen3_moe"
    assert max_abs_diff(twin(LONG), mlx_lm.load(str(path))[0](LONG)) == 0.0


def test_hugging_face_per_expert_layout_loads_to_the_same_model(f32, tmp_path):
    """Hugging Face stores mlp.experts.<e>.<proj>; both loaders stack them into switch_mlp."""
    import mlx_lm

    hf = float32_copy(f32, tmp_path / "hf", rename=per_expert)
    assert any(".experts.7.down_proj." in k for k in mx.load(str(hf / "model.safetensors")))
    ours, _ = mlxinfer.load(hf, compute_dtype="bfloat16")
    stacked, _ = mlxinfer.load(f32, compute_dtype="bfloat16")
    assert max_abs_diff(ours(LONG), stacked(LONG)) == 0.0
    assert max_abs_diff(ours(LONG), mlx_lm.load(str(hf))[0](LONG)) == 0.0
    counted = mlxinfer.count(hf)  # count gathers the per-expert tensors as the loaders stack them
    assert not counted.stored["extra"] and not counted.stored["missing"]

    weights = mx.load(str(hf / "model.safetensors"))
    del weights["model.layers.1.mlp.experts.3.up_proj.weight"]
    mx.save_safetensors(str(hf / "model.safetensors"), weights)
    assert_one_line_error(invoke_cli("topk", "-m", str(hf), "-p", "hi"), "model.layers.1.mlp.experts.3.up_proj.weight")


def test_routing_is_what_mlx_lms_router_chooses(mlx_lm_dir):
    """topk --explain's routing: per layer, the k experts with the highest router probability for the
    last token, best first, their weights rescaled to 1 (norm_topk_prob), computed again here through
    mlx-lm's own modules."""
    import mlx_lm

    path = mlx_lm_dir("qwen3_moe", "4bit")
    model, tok = mlxinfer.load(path, compute_dtype="bfloat16")
    table = mlxinfer.next_token_table(model, tok, "Name one fruit.", explain_sampler=True)
    k, n = model.config.num_experts_per_tok, model.config.num_experts
    assert [r.layer for r in table.routing] == list(range(model.config.num_hidden_layers))

    peer, _ = mlx_lm.load(str(path))
    h = peer.model.embed_tokens(mx.array([table.prompt_ids]))
    for layer, choice in zip(peer.model.layers, table.routing):
        h = h + layer.self_attn(layer.input_layernorm(h), "causal", None)
        x = layer.post_attention_layernorm(h)
        probs = mx.softmax(layer.mlp.gate(x[:, -1]), axis=-1, precise=True)[0].astype(mx.float32)  # (n,)
        best = mx.argsort(-probs)[:k].tolist()
        assert choice.experts == best and len(set(choice.experts)) == k and max(best) < n
        expected = probs[mx.array(best)] / probs[mx.array(best)].sum()
        assert choice.weights == pytest.approx(expected.tolist(), abs=2e-2)  # bf16 probabilities
        assert sum(choice.weights) == pytest.approx(1.0, abs=1e-2) and choice.weights == sorted(choice.weights)[::-1]
        h = h + layer.mlp(x)

    shown = invoke_cli("topk", "-m", str(path), "-p", "Name one fruit.", "--explain")
    assert shown.returncode == 0 and "experts the last token chose" in shown.stdout


def test_quantize_equals_mlx_lms_convert_routers_at_8_bits(mlx_lm_dir, tmp_path):
    """`mlxinfer quantize` of a Qwen3-MoE writes mlx-lm's convert's tensors: experts stacked and
    quantized, the routers at 8 bits (mlx-lm's quant_predicate for the class)."""
    from mlxinfer_quant import quantize

    src = mlx_lm_dir("qwen3_moe")
    quantize(src, tmp_path / "ours", bits=4, group_size=64)
    ours = mx.load(str(tmp_path / "ours" / "model.safetensors"))
    peer = mx.load(str(mlx_lm_dir("qwen3_moe", "4bit") / "model.safetensors"))
    assert sorted(ours) == sorted(peer)
    for name in ours:
        assert mx.array_equal(ours[name], peer[name]).item(), name
    block = json.loads((tmp_path / "ours" / "config.json").read_text())["quantization"]
    assert block["model.layers.0.mlp.gate"] == {"group_size": 64, "bits": 8} and block["bits"] == 4
    assert ours["model.layers.0.mlp.switch_mlp.up_proj.scales"].shape == (8, 64, 2)  # (n, F, D / 64)


def test_bf16_experts_on_the_cpu_run_in_float32(mlx_lm_dir):
    """MLX's CPU gather matmul computes only in float32 (mlx-lm's own model fails there): as stored, the
    experts are upcast on load, exactly, and everything else stays bf16."""
    path = mlx_lm_dir("qwen3_moe")
    model, _ = mlxinfer.load(path, compute_dtype="bfloat16")
    experts = model.layers[0].mlp.switch_mlp.up_proj.weight
    stored = mx.load(str(path / "model.safetensors"))["model.layers.0.mlp.switch_mlp.up_proj.weight"]
    assert experts.dtype == (mx.float32 if ON_CPU else mx.bfloat16)
    assert mx.array_equal(experts, stored.astype(experts.dtype)).item()
    assert model.layers[0].self_attn.q_proj.weight.dtype == mx.bfloat16
    assert model(SHORT).shape == (1, 5, 384)


def test_count_of_a_tiny_qwen3_moe_by_hand(mlx_lm_dir):
    """D 128, 2 layers, 8 experts of width 64, 2 per token; V 384, untied."""
    r = mlxinfer.count(mlx_lm_dir("qwen3_moe"))
    D, F, n, k, V = 128, 64, 8, 2, 384
    attention = D * (4 * 32) * 2 + D * (2 * 32) * 2 + 2 * 32  # q, o; k, v; q/k norms
    experts = n * 3 * D * F
    layer = attention + D * n + experts + 2 * D
    assert r.total == 2 * V * D + 2 * layer + D
    assert r.experts["active"] == r.total - 2 * experts + 2 * k * 3 * D * F
    assert checkpoints.MLX_LM_ARCHS["qwen3_moe"]["num_experts"] == n


def test_count_from_headers_runs_k_of_the_n_experts_stored(tmp_path):
    """A mixture no Architecture describes (mlx-lm's qwen2_moe) is counted from its safetensors headers;
    its stacked experts count k of n toward operations per token, as a described mixture's do (they all
    counted: ~5x the operations of a real Qwen1.5-MoE-A2.7B)."""
    n, k, D, F, L = 4, 2, 128, 32, 2
    path = checkpoints.write_mlx_lm_checkpoint(
        tmp_path / "qwen2_moe", "mixtral", model_type="qwen2_moe", num_experts=n, num_experts_per_tok=k,
        moe_intermediate_size=F, shared_expert_intermediate_size=64, decoder_sparse_step=1, mlp_only_layers=[],
    )  # fmt: skip
    r = mlxinfer.count(path)
    experts = L * n * 3 * D * F  # gate, up and down of every expert, in every layer
    assert r.experts["experts_total"] == experts and r.experts["layers_with_experts"] == L
    assert r.experts["active"] == r.total - experts // n * (n - k)
    assert r.operations["parameters_in_arithmetic"] == r.experts["active"] - r.embedding, r.operations


def test_count_from_headers_finds_gpt_oss_experts_stacked_under_experts(tmp_path):
    """mlx-lm's gpt_oss stacks its experts as `mlp.experts.<proj>.weight` (and their biases, one row an
    expert), not under switch_mlp: count took them for one dense MLP, every token using all of them."""
    from mlx.utils import tree_flatten

    n, k, D, L = 4, 2, 64, 2
    cfg = dict(checkpoints.BASE, model_type="gpt_oss", num_local_experts=n, num_experts_per_tok=k, hidden_size=D,
               intermediate_size=32, head_dim=16, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=L,
               sliding_window=8, layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    model = checkpoints.mlx_lm_model(cfg)
    params = dict(tree_flatten(model.parameters()))
    experts = sum(v.size for name, v in params.items() if ".experts." in name)  # mlx-lm's own shapes
    assert experts and all(v.shape[0] == n for name, v in params.items() if ".experts." in name)
    out = tmp_path / "gpt_oss"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(cfg))
    mx.save_safetensors(
        str(out / "model.safetensors"), {k_: mx.zeros(v.shape, mx.bfloat16) for k_, v in params.items()}
    )
    r = mlxinfer.count(str(out))
    assert r.total == sum(v.size for v in params.values())
    assert r.experts["experts_total"] == experts and r.experts["layers_with_experts"] == L
    assert r.experts["active"] == r.total - experts // n * (n - k)
