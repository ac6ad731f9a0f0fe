"""The benchmark keeps working: a few tokens on a tiny checkpoint, every engine, the same tokens."""

from __future__ import annotations

import json

import pytest
from conftest import assert_one_line_error, invoke_cli

from mlxinfer.engine.bench import bytes_per_token, run_bench


@pytest.mark.slow
def test_bench_runs_every_engine_on_the_same_tokens(checkpoint_dir):
    report = run_bench(
        str(checkpoint_dir("llama", 4, 64)), prompt_tokens=(4, 9), gen_tokens=3, repeats=1, bandwidth_gb_s=10.0
    )
    engines = {r.engine for r in report.rows}
    # 4-bit: the kernel takes it, with float32 activations and with int8 ones
    assert engines == {"mlx-lm", "mlxinfer", "mlxinfer quantized", "mlxinfer int8", "mlxinfer float32"}
    assert len(report.rows) == 10
    base = {r.prompt_tokens: r for r in report.rows if r.engine == "mlx-lm"}
    assert sorted(base) == [4, 9]
    for r in report.rows:
        # greedy tokens equal mlx-lm's on each of our float paths (int8 rounds the activations: near ties may flip)
        assert r.same_tokens or r.engine == "mlxinfer int8", r
        assert r.prefill_tokens_per_s > 0 and r.decode_tokens_per_s > 0 and r.ttft_s > 0
        # each ratio is this row's speed over mlx-lm's row at the same prompt length (itself: 1)
        mlx_lm = base[r.prompt_tokens]
        assert r.prefill_ratio == pytest.approx(r.prefill_tokens_per_s / mlx_lm.prefill_tokens_per_s)
        assert r.decode_ratio == pytest.approx(r.decode_tokens_per_s / mlx_lm.decode_tokens_per_s)
    ours = [r for r in report.rows if r.engine != "mlx-lm"]
    assert ours and any(r.decode_ratio != 1.0 for r in ours)  # measured, not a default left in place
    # the roofline: float32 weights are bigger than 4-bit ones, so their bound is lower
    assert report.roofline["mlxinfer float32"]["bytes_per_token"] > report.roofline["mlxinfer"]["bytes_per_token"]
    # ... and the quantized path reads the packed weights, as stored
    assert (
        report.roofline["mlxinfer quantized"]["bytes_per_token"]
        < report.roofline["mlxinfer float32"]["bytes_per_token"]
    )
    # ... and the int8 path the same codes in its own order, with scales and biases one per lane (a few more)
    int8, quantized = (report.roofline[f"mlxinfer {p}"]["bytes_per_token"] for p in ("int8", "quantized"))
    assert quantized <= int8 < report.roofline["mlxinfer float32"]["bytes_per_token"]
    assert report.roofline["mlxinfer"]["max_tokens_per_s"] == pytest.approx(
        10.0e9 / report.roofline["mlxinfer"]["bytes_per_token"]
    )


def test_bench_says_when_other_processes_held_the_cores(checkpoint_dir):
    """A process spinning beside the runs shows as the others' share of the cores, and the table then
    says the machine was busy; at 0 it says nothing. (That this process's own work is not counted is not
    asserted: under pytest-xdist the other worker's load moves by more than a test could tell apart.)"""
    import os
    import subprocess
    import sys
    import time

    from mlxinfer.engine.bench import OtherLoad
    from mlxinfer_cli.commands.bench import BUSY, markdown

    if OtherLoad().start is None:
        pytest.skip("no /proc/stat on this system")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # started
        others = OtherLoad()
        time.sleep(1.0)
        busy = others.fraction()
    finally:
        spinner.kill()
        spinner.wait()
    one_core = 1 / os.cpu_count()
    assert busy > 0.6 * one_core, busy  # (the suite's other worker, if any, only adds to it)
    report = run_bench(str(checkpoint_dir("llama", 4, 64)), prompt_tokens=(4,), gen_tokens=2, repeats=1,
                       bandwidth_gb_s=10.0, fast_path=False)  # fmt: skip
    report.other_cpu_fraction = 0.0
    assert "busy" not in markdown(report)
    report.other_cpu_fraction = shown = max(busy, BUSY)  # one spinner of many cores can be under the line
    assert f"other processes used {shown:.0%} of its cores" in markdown(report)


def test_bytes_per_token_skips_the_untied_embedding(checkpoint_dir):
    import mlxinfer

    model, _ = mlxinfer.load(
        checkpoint_dir("llama"), compute_dtype="bfloat16"
    )  # untied: the lookup reads one row, lm_head is read whole
    cfg = model.config
    layer = (
        2 * cfg.hidden_size
        + 2 * cfg.hidden_size * cfg.num_attention_heads * cfg.head_dim
        + 2 * cfg.hidden_size * cfg.num_key_value_heads * cfg.head_dim
        + 3 * cfg.hidden_size * cfg.intermediate_size
    )
    params = cfg.num_hidden_layers * layer + cfg.hidden_size + cfg.vocab_size * cfg.hidden_size
    assert bytes_per_token(model, tied=False) == 2 * params  # bf16


@pytest.mark.slow
def test_bench_cli_json_and_bad_input(checkpoint_dir):
    path = str(checkpoint_dir("qwen3"))
    out = invoke_cli(
        "bench",
        "-m",
        path,
        "--prompt-tokens",
        "4",
        "--gen-tokens",
        "2",
        "--repeats",
        "1",
        "--no-fast",
        "--bandwidth",
        "5GB/s",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert {r["engine"] for r in data["rows"]} == {"mlx-lm", "mlxinfer"}
    assert data["bandwidth_source"] == "given" and data["bandwidth_gb_s"] == 5.0
    assert_one_line_error(invoke_cli("bench", "-m", path, "--gen-tokens", "1"), "gen-tokens")


def test_a_llama_cpp_that_does_not_import_is_one_line_not_a_traceback(tmp_path, monkeypatch):
    """llama-cpp-python installed without its dependencies (pip install --no-deps): found, but its import
    fails. bench says so and how to go on, where it used to end in the import's traceback."""
    from mlxinfer.engine.bench import llama_cpp_loop
    from mlxinfer.errors import MlxinferError

    package = tmp_path / "llama_cpp"
    package.mkdir()
    (package / "__init__.py").write_text("import diskcache_that_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "llama_cpp", raising=False)
    with pytest.raises(MlxinferError, match="llama_cpp is installed but does not import .*--no-llama-cpp") as e:
        llama_cpp_loop(str(tmp_path / "model.gguf"), 64)
    assert "diskcache_that_is_not_installed" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "how, said",
    [
        ("os.kill(os.getpid(), signal.SIGSEGV)", r"died of SIGSEGV decoding model.gguf in a test process;"),
        (
            "raise RuntimeError('no kernel for this type')",
            r"failed decoding model.gguf in a test process \(RuntimeError: no kernel for this type\);",
        ),
    ],
)
def test_a_llama_cpp_that_crashes_is_one_line_before_it_takes_bench_down(tmp_path, monkeypatch, how, said):
    """A llama.cpp built with kernels that crash here (its AMX kernels did, at the first token, on a Xeon VM)
    used to end bench in a segmentation fault with nothing printed. It is tried in a child process first."""
    from mlxinfer.engine.bench import llama_cpp_loop
    from mlxinfer.errors import MlxinferError

    package = tmp_path / "llama_cpp"
    package.mkdir()
    (package / "__init__.py").write_text(
        "import os, signal\n"
        "class Llama:\n"
        "    def __init__(self, **kwargs):\n"
        "        pass\n"
        "    def generate(self, ids, **kwargs):\n"
        f"        {how}\n"
        "        yield 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "llama_cpp", raising=False)
    with pytest.raises(MlxinferError, match=f"llama.cpp {said} .*--no-llama-cpp") as e:
        llama_cpp_loop(str(tmp_path / "model.gguf"), 64)
    assert "\n" not in str(e.value)
