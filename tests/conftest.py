"""Shared fixtures: tiny checkpoints written once per session, the embedded model loaded once."""

from __future__ import annotations

import os
import random
import select
import socket
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import mlxinfer  # noqa: E402,F401  (first: it loads a fast BLAS before anything imports mlx)
import checkpoints  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FUZZ_SEED = pytest.StashKey[int]()  # set by tests/fuzz/test_fuzz.py, printed at the end of the run


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: takes seconds (a model decoding many tokens, a subprocess, mlx.launch); `make check` skips"
    )
    if not hasattr(config, "workerinput"):  # the run's one process, or pytest-xdist's controller
        # the fuzzer's seed for this run, drawn here so that every xdist worker inherits the same one
        # and the controller can print it; MLXINFER_FUZZ_SEED set by hand replays a run
        os.environ.setdefault("MLXINFER_FUZZ_SEED", str(random.SystemRandom().randrange(2**32)))
        config.stash[FUZZ_SEED] = int(os.environ["MLXINFER_FUZZ_SEED"])


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    seed = config.stash.get(FUZZ_SEED, None)
    ran = any(
        "fuzz" in r.nodeid for reports in terminalreporter.stats.values() for r in reports if hasattr(r, "nodeid")
    )
    if seed is not None and ran:
        terminalreporter.write_line(f"fuzz: seed {seed} (replay: MLXINFER_FUZZ_SEED={seed} pytest tests/fuzz)")


# (arch, bits, group size); bits None is the bf16 checkpoint
VARIANTS = [
    ("llama", None, None),
    ("llama", 4, 64),
    ("llama", 8, 32),
    ("qwen3", None, None),
    ("qwen3", 4, 128),
    ("qwen3", 8, 64),
    ("qwen2", None, None),
]


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory):
    """checkpoint_dir(arch, bits=None, group_size=None) -> Path, written on first use."""
    root = tmp_path_factory.mktemp("checkpoints")
    made: dict[tuple, Path] = {}

    def get(arch: str, bits: int | None = None, group_size: int | None = None) -> Path:
        key = (arch, bits, group_size)
        if key not in made:
            if bits is None:
                made[key] = checkpoints.write_checkpoint(root / arch, arch)
            else:
                made[key] = checkpoints.quantized_copy(
                    get(arch), root / f"{arch}-{bits}bit-g{group_size}", bits, group_size
                )
        return made[key]

    return get


@pytest.fixture(scope="session")
def mlx_lm_dir(tmp_path_factory):
    """mlx_lm_dir(arch, variant="bf16") -> Path: a tiny checkpoint written with mlx-lm's own class for
    `arch` (checkpoints.MLX_LM_ARCHS); "4bit" is mlx-lm's convert of it (bf16 scales, as mlx-community
    publishes), "4bit-f32" the same with float32 scales (float32 activations as stored)."""
    root = tmp_path_factory.mktemp("mlx_lm_checkpoints")
    made: dict[tuple, Path] = {}

    def get(arch: str, variant: str = "bf16") -> Path:
        key = (arch, variant)
        if key not in made:
            out = root / f"{arch}-{variant}"
            if variant == "bf16":
                made[key] = checkpoints.write_mlx_lm_checkpoint(out, arch)
            else:
                dtype = "float32" if variant == "4bit-f32" else None
                made[key] = checkpoints.quantized_copy(get(arch), out, 4, 64, dtype=dtype)
        return made[key]

    return get


@pytest.fixture(scope="session")
def loaded(checkpoint_dir):
    """loaded(arch, bits=None, group_size=None, compute_dtype="auto") -> (model, tokenizer) of a tiny
    checkpoint, loaded once per session: for tests that only read the model (one that changes its
    weights or modules loads its own)."""
    made: dict[tuple, tuple] = {}

    def get(arch: str, bits: int | None = None, group_size: int | None = None, compute_dtype: str = "auto"):
        key = (arch, bits, group_size, compute_dtype)
        if key not in made:
            made[key] = mlxinfer.load(checkpoint_dir(arch, bits, group_size), compute_dtype=compute_dtype)
        return made[key]

    return get


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2-135M-Instruct as stored (4-bit GGUF), loaded once: (model, tokenizer)."""
    return mlxinfer.load(None, compute_dtype="bfloat16")


@pytest.fixture(scope="session")
def embedded_fast():
    """The embedded model with float32 weights (the BLAS path): for tests where any one model will do."""
    return mlxinfer.load(None, compute_dtype="float32")


@pytest.fixture(scope="session")
def embedded_quantized():
    """The embedded model on the quantized path (packed weights, the extension's kernel and fused layers)."""
    return mlxinfer.load(None, compute_dtype="quantized")


@pytest.fixture(params=[True, False], ids=["512-bit tiles", "256-bit tiles"])
def tile_width(request):
    """The kernel's several-row tiles 512-bit, then 256-bit (native/qmm/wide.h picks one
    per CPU; the bits must not depend on it). Skipped for 512-bit where the build has no AVX-512F."""
    from mlxinfer.cpu import qmm

    if not qmm.available():
        pytest.skip(f"the quantized matmul kernel is not available here: {qmm.status()['reason']}")
    kernel = qmm.kernel()
    before = kernel.wide()
    kernel.set_wide(request.param)
    if kernel.wide() != request.param:
        pytest.skip("this build has no AVX-512F: its tiles are 256-bit only")
    yield request.param
    kernel.set_wide(before)


@pytest.fixture(scope="session")
def embedded_int8():
    """The embedded model on the int8 path (the quantized path's layers, activations rounded to 8 bits)."""
    return mlxinfer.load(None, compute_dtype="int8")


HERB = "Name one herb to add to tomato soup. Answer with one word."
HERB_SEEDS = dict(seeds=16, settings={"temperature": 1.0}, max_tokens=5, batch_size=16)


@pytest.fixture(scope="session")
def herb_seeds_without_the_kernel(embedded):
    """sample(embedded as stored, HERB, **HERB_SEEDS) with each row drawn by MLX's own ops (the batched
    draw kernel off), run once: test_experiments holds it to mlx-lm's draws, test_draw_kernel the kernel
    to it. (report, rows the kernel drew: 0)."""
    from mlxinfer.cpu import draw as cpu_draw

    model, tokenizer = embedded
    cpu_draw.available()  # decided now, so that what is switched off here stays off for the run
    was, real, calls = cpu_draw._state["active"], cpu_draw.draw_rows, []
    cpu_draw._state["active"] = False
    cpu_draw.draw_rows = lambda scaled, uniforms, lib=None: calls.append(len(uniforms)) or real(scaled, uniforms, lib)
    try:
        return mlxinfer.sample(model, tokenizer, HERB, **HERB_SEEDS), sum(calls)
    finally:
        cpu_draw._state["active"], cpu_draw.draw_rows = was, real


def free_ports(n: int = 1, tries: int = 100) -> int:
    """The first of n consecutive loopback ports that are free now, each checked by binding it (for
    mlx.launch's ring, which takes --starting-port and the ports after it): was a random port, never
    checked, so a port in use failed a run now and then. Below Linux's ephemeral range (32768 up): a port
    checked free there could be taken for another test's outgoing connection before the ring bound it."""
    for _ in range(tries):
        start, held = random.randint(20000, 32000 - n), []
        try:
            for port in range(start, start + n):
                held.append(socket.socket())
                held[-1].bind(("127.0.0.1", port))
            return start
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports found in {tries} tries")


def run_cli(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run `python -m mlxinfer ARGS` as a user would, from the repository root."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "mlxinfer", *args],
        cwd=ROOT,
        env=full_env,
        stdin=subprocess.DEVNULL,  # not the runner's own: a command given no prompt reads a piped stdin
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def invoke_cli(*args: str, input: str | bytes | None = None) -> subprocess.CompletedProcess:
    """Run the CLI in this process (no start-up cost); same exit code and streams as `run_cli`.
    input: what the command reads on standard input."""
    from typer.testing import CliRunner

    from mlxinfer_cli.app import app

    result = CliRunner().invoke(app, list(args), input=input)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(list(args), result.exit_code, result.stdout, result.stderr)


def start_held(*args: str, at: str, target, n: int | None = None, timeout: float = 120) -> subprocess.Popen:
    """Start `python -m mlxinfer ARGS` through tests/stop_point.py and return once it is held at a known
    point (`at` "rename": just before TARGET is renamed into place; "synced": just after the n-th synced
    write to TARGET), so that a signal sent now arrives there. Its stdout and stderr are pipes."""
    r, w = os.pipe()
    point = [str(w), at, str(target), *([str(n)] if n is not None else [])]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "stop_point.py"), *point, "--", *args],
        cwd=ROOT,
        pass_fds=(w,),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], timeout)
        got = os.read(r, 1) if ready else b""
    finally:
        os.close(r)
    if got != b"!":  # it ended (or hung) before the point: say how
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"never held at {at} {target} (exit {proc.returncode}): {err[-2000:]}")
    return proc


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> None:
    """Bad input: exit 2, one line on stderr that names the problem, no traceback, nothing on stdout."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment.lower() in lines[0].lower(), (fragment, lines[0])
