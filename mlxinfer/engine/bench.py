"""A side-by-side benchmark: our model and loop against mlx-lm's, on the same weights, in one run.

Each engine runs greedy prefill + decode at several prompt lengths; repeats are
interleaved (the engine order rotates) so that machine noise hits all engines
alike, and each figure is the median over repeats. Ratios are ours / mlx-lm's.
Tokens must match mlx-lm's, or the row says they differ.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Optional

import mlx.core as mx

from .. import defaults
from ..errors import MlxinferError, check_bool, check_listed_once, check_whole

TEXT = (
    "Priya owns the cooking assistant in Cookvale, a recipe app. She downloads an open model and asks "
    "the same question twice: name one herb to add to tomato soup. The first time it answers thyme, the "
    "second time dill. Same file, same prompt, same laptop. The forward pass turns token ids into one "
    "score for every vocabulary entry; the sampler, not the model, makes the final choice. "
)


@dataclass
class Timing:
    engine: str
    prompt_tokens: int
    ttft_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    peak_memory_bytes: Optional[int]
    tokens: list[int]


@dataclass
class BenchRow:
    engine: str
    path: str  # how the engine's weights are stored (the BLAS is the report's)
    prompt_tokens: int
    load_s: Optional[float]  # None: not measured (llama.cpp loads before the runs, in its own library)
    ttft_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    peak_memory_bytes: Optional[int]  # MLX's peak; None for llama.cpp, whose memory MLX does not see
    same_tokens: bool  # greedy tokens equal mlx-lm's
    prefill_ratio: float = 1.0  # ours / mlx-lm's, same prompt length
    decode_ratio: float = 1.0
    roofline_fraction: float = 0.0  # decode tokens/s over the memory-bound limit


@dataclass
class BenchReport:
    model: str
    machine: str
    blas: str
    bandwidth_gb_s: float
    bandwidth_source: str
    gen_tokens: int
    repeats: int
    rows: list[BenchRow] = field(default_factory=list)
    roofline: dict = field(default_factory=dict)  # engine -> {bytes_per_token, max_tokens_per_s}
    help_seconds: float = 0.0  # `mlxinfer --help` wall time over `python -c pass`
    peers: dict = field(default_factory=dict)  # peer -> {version, system_info}: which build and kernels it ran
    # the share of the machine's cores other processes used during the runs (None where /proc/stat is not)
    other_cpu_fraction: Optional[float] = None

    def to_dict(self) -> dict:
        return asdict(self)


def prompt_ids(tokenizer, n: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < n:
        ids += tokenizer.encode(TEXT)
    return ids[:n]


def timed(stream: Iterator[int], n_prompt: int) -> tuple[float, float, float, list[int]]:
    """(ttft, prefill tok/s, decode tok/s, tokens) for a stream of greedy tokens."""
    start = time.perf_counter()
    tokens, first = [], None
    for token in stream:
        tokens.append(token)
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    ttft = first - start
    return ttft, n_prompt / ttft, (len(tokens) - 1) / max(end - first, 1e-9), tokens


def ours(model, tokenizer) -> Callable[[list[int], int], Iterator[int]]:
    from ..settings import GREEDY
    from .core import RowSpec
    from .decode import prefill_and_decode

    def stream(ids: list[int], n: int) -> Iterator[int]:
        steps = prefill_and_decode(model, tokenizer, ids, [RowSpec(None, GREEDY, n)])
        return (s.token for _, s in steps if s.token is not None)

    return stream


def mlx_lm_loop(twin) -> Callable[[list[int], int], Iterator[int]]:
    from mlx_lm.generate import generate_step

    return lambda ids, n: (t for t, _ in generate_step(mx.array(ids), twin, max_tokens=n))


def measure_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """GB/s of a plain memory copy (bytes read + written), the roofline's memory speed when none is given.

    numpy's copy is a memcpy; an MLX elementwise op on the CPU is one thread of arithmetic and
    would understate the memory.
    """
    import numpy as np

    a = np.ones(megabytes * 2**20 // 4, np.float32)
    b = np.empty_like(a)
    np.copyto(b, a)  # warm-up: the first pass also faults the pages in
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - start)
    return 2 * a.nbytes / statistics.median(times) / 1e9


def bytes_per_token(model, tied: bool) -> int:
    """Weight bytes one decode step reads: everything but the embedding rows it does not look up."""
    from mlx.utils import tree_flatten

    params = dict(tree_flatten(model.parameters()))
    total = sum(p.nbytes for p in params.values())
    if not tied:  # the lookup reads one row; the output table is lm_head
        total -= sum(p.nbytes for k, p in params.items() if "embed_tokens." in k)
    return total


def help_overhead() -> float:
    def wall(args):
        start = time.perf_counter()
        subprocess.run([sys.executable, *args], capture_output=True, check=False)
        return time.perf_counter() - start

    runs = [(wall(["-m", "mlxinfer", "--help"]), wall(["-c", "pass"])) for _ in range(3)]
    return statistics.median(a - b for a, b in runs)


class OtherLoad:
    """How much of the machine other processes used from now until fraction() (Linux: /proc/stat's busy
    time less this process's own). A busy machine slows every engine, llama.cpp's spinning threads most."""

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample() -> Optional[tuple[float, float, float]]:
        import os

        try:
            with open("/proc/stat") as f:
                cpu = [int(v) for v in f.readline().split()[1:]]
            if len(cpu) < 5:
                return None
        except (OSError, ValueError):
            return None
        busy = (sum(cpu[:8]) - cpu[3] - cpu[4]) / os.sysconf("SC_CLK_TCK")  # all but idle and iowait
        own = sum(os.times()[:4])  # user and system, this process's threads and waited-for children
        return time.perf_counter(), busy, own

    def fraction(self) -> Optional[float]:
        import os

        end = self._sample()
        if self.start is None or end is None or end[0] - self.start[0] <= 0:
            return None
        wall, busy, own = (b - a for a, b in zip(self.start, end))
        return max(0.0, min(1.0, (busy - own) / (wall * (os.cpu_count() or 1))))


def llama_cpp_info() -> dict:
    """The importable llama.cpp's version and its own system-info line (the SIMD kernels its build has:
    a build narrower than the CPU, e.g. without AVX-512 on an AVX-512 machine, is not a fair peer)."""
    import llama_cpp

    return {
        "version": getattr(llama_cpp, "__version__", "unknown"),
        "system_info": llama_cpp.llama_print_system_info().decode(errors="replace").strip(),
    }


_PROBE = """
import sys
from llama_cpp import Llama
threads = int(sys.argv[2])
llm = Llama(model_path=sys.argv[1], n_ctx=64, n_threads=threads, n_threads_batch=threads, verbose=False)
for i, _ in enumerate(llm.generate([1, 2, 3, 4], top_k=1, temp=0.0, reset=True)):
    if i:
        break
"""


def _probe_llama_cpp(path: str, threads: int) -> None:
    """Load and decode two tokens in a child process first: a llama.cpp that crashes (a build whose kernels this
    machine cannot run, such as AMX on a VM that does not grant it) would take the whole bench down, unexplained."""
    import signal

    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, str(path), str(threads)], capture_output=True, text=True, timeout=600
        )
    except subprocess.TimeoutExpired:
        raise MlxinferError(
            f"llama.cpp did not decode two tokens of {Path(path).name} within 600 s in a test process; leave it out "
            "with --no-llama-cpp",
            "llama_cpp",
        ) from None
    if done.returncode == 0:
        return
    lines = done.stderr.strip().splitlines()
    how = f"died of {signal.Signals(-done.returncode).name}" if done.returncode < 0 else "failed"
    said = f" ({' '.join(lines[-1].split())[:160]})" if lines and done.returncode > 0 else ""
    raise MlxinferError(
        f"llama.cpp {how} decoding {Path(path).name} in a test process{said}; rebuild llama-cpp-python for this "
        "machine (docs/commands.md, bench) or leave it out with --no-llama-cpp",
        "llama_cpp",
    )


def llama_cpp_loop(path: str, n_ctx: int) -> Optional[Callable[[list[int], int], Iterator[int]]]:
    """llama.cpp (llama-cpp-python) on the same GGUF file, greedy, with MLX's CPU thread count; None
    when llama_cpp is not importable or the model is no GGUF file."""
    import importlib.util
    import os

    if not str(path).endswith(".gguf") or importlib.util.find_spec("llama_cpp") is None:
        return None
    try:
        from llama_cpp import Llama
    except Exception as e:  # installed, but its import fails (a missing dependency, a library built for another CPU)
        raise MlxinferError(
            f"llama_cpp is installed but does not import ({type(e).__name__}: {' '.join(str(e).split())}); "
            "repair it (pip install "
            "llama-cpp-python with its dependencies) or leave it out with --no-llama-cpp",
            "llama_cpp",
        ) from None

    threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    _probe_llama_cpp(path, threads)
    llm = Llama(model_path=str(path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)

    def stream(ids: list[int], n: int) -> Iterator[int]:
        llm.reset()  # no prefix reuse from the last run: every prefill starts at position 0
        for i, token in enumerate(llm.generate(ids, top_k=1, temp=0.0, reset=True)):
            yield token
            if i + 1 == n:
                break

    return stream


def run_bench(
    source: Optional[str] = None,
    prompt_tokens: tuple[int, ...] = defaults.BENCH_PROMPT_TOKENS,
    gen_tokens: int = 64,
    repeats: int = 3,
    bandwidth_gb_s: Optional[float] = None,
    fast_path: bool = True,
    progress: Optional[Callable[[int, int], None]] = None,
    llama_cpp: bool = True,
) -> BenchReport:
    """mlx-lm, our model on each compute path, and llama.cpp when it is importable (a GGUF source),
    interleaved; ratios are each engine's over mlx-lm's."""
    from ..model import system
    from ..model.loading import load
    from ..model.peers import mlx_lm_twin
    from .decode import check_progress

    lengths = [prompt_tokens] if isinstance(prompt_tokens, int) else prompt_tokens
    if not isinstance(lengths, (list, tuple)) or not lengths:
        raise MlxinferError(
            f"prompt_tokens must be lengths of 2 tokens or more, got {prompt_tokens!r:.60}", "prompt_tokens"
        )
    for n in lengths:
        check_whole(n, "prompt_tokens", 2, "lengths of 2 tokens or more")
    check_listed_once(list(lengths), "prompt_tokens")
    check_whole(gen_tokens, "gen_tokens", 2, "at least 2")
    check_whole(repeats, "repeats", 1, "at least 1")
    if bandwidth_gb_s is not None and not (
        isinstance(bandwidth_gb_s, (int, float))
        and not isinstance(bandwidth_gb_s, bool)
        and 0 < bandwidth_gb_s < math.inf
    ):
        raise MlxinferError(
            f"bandwidth_gb_s must be a positive, finite GB/s, got {bandwidth_gb_s!r:.60}", "bandwidth_gb_s"
        )
    check_bool(fast_path, "fast_path")
    check_bool(llama_cpp, "llama_cpp")
    check_progress(progress)
    prompt_tokens = tuple(lengths)
    engines, load_s, paths, models = {}, {}, {}, {}
    start = time.perf_counter()
    model, tokenizer = load(source, compute_dtype="bfloat16")  # the weights as stored, as mlx_lm.load keeps them
    load_s["mlxinfer"] = time.perf_counter() - start
    if max(prompt_tokens) + gen_tokens > model.config.max_position_embeddings:
        raise MlxinferError(
            f"prompt_tokens + gen_tokens exceed the model's context "
            f"{model.config.max_position_embeddings:,}; use shorter ones",
            "prompt_tokens",
            "gen_tokens",
        )
    start = time.perf_counter()
    twin = mlx_lm_twin(model)
    load_s["mlx-lm"] = load_s["mlxinfer"] + time.perf_counter() - start  # mlx-lm cannot read GGUF itself
    engines["mlx-lm"], engines["mlxinfer"] = mlx_lm_loop(twin), ours(model, tokenizer)
    paths["mlx-lm"] = paths["mlxinfer"] = model.info.weights
    models.update({"mlx-lm": twin, "mlxinfer": model})
    from ..cpu import qmm
    from ..model.convert import quantizable

    paths_to_run = ["float32"] if fast_path else []
    if quantizable(model) and qmm.available():  # weights kept packed, the batch-invariant kernel
        paths_to_run[:0] = ["quantized", "int8"]  # int8: llama.cpp's arithmetic, beside llama.cpp
    for dtype in paths_to_run:
        start = time.perf_counter()
        fast, _ = load(source, compute_dtype=dtype)
        name = f"mlxinfer {dtype}"
        load_s[name] = time.perf_counter() - start
        engines[name], paths[name], models[name] = ours(fast, tokenizer), fast.info.weights, fast
    source_info = model.info.source
    gguf = source_info.path if source_info is not None and source_info.kind == "gguf" else None
    peer = llama_cpp_loop(gguf, max(prompt_tokens) + gen_tokens + 8) if llama_cpp and gguf else None
    if peer is not None:
        engines["llama.cpp"], paths["llama.cpp"], load_s["llama.cpp"] = peer, "GGUF as stored", None

    names = list(engines)
    for name in names:  # warm-up: first calls allocate and build kernels
        list(engines[name](prompt_ids(tokenizer, 8), 2))
    results: dict[tuple[str, int], list[Timing]] = {}
    total, done = repeats * len(prompt_tokens) * len(names), 0
    others = OtherLoad()
    for r in range(repeats):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotate who goes first
        for n in prompt_tokens:
            ids = prompt_ids(tokenizer, n)
            for name in order:
                mx.reset_peak_memory()
                ttft, pre, dec, toks = timed(engines[name](ids, gen_tokens), n)
                peak = None if name == "llama.cpp" else mx.get_peak_memory()
                results.setdefault((name, n), []).append(Timing(name, n, ttft, pre, dec, peak, toks))
                done += 1
                if progress:
                    progress(done, total)

    bandwidth_source = "given" if bandwidth_gb_s else "measured (copy benchmark)"
    bandwidth = bandwidth_gb_s or measure_bandwidth()
    report = BenchReport(
        model=model.info.name,
        machine=machine(),
        blas=system.describe(),
        bandwidth_gb_s=bandwidth,
        bandwidth_source=bandwidth_source,
        gen_tokens=gen_tokens,
        repeats=repeats,
        other_cpu_fraction=others.fraction(),
    )
    for name, m in models.items():
        b = bytes_per_token(m, model.config.tie_word_embeddings)
        report.roofline[name] = {"bytes_per_token": b, "max_tokens_per_s": bandwidth * 1e9 / b}
    if peer is not None:  # llama.cpp reads the GGUF's bytes: the as-stored weights
        report.roofline["llama.cpp"] = report.roofline["mlxinfer"]
        report.peers["llama.cpp"] = llama_cpp_info()
    for n in prompt_tokens:
        reference = results[("mlx-lm", n)][0].tokens
        rows = {name: _median_row(name, n, results, load_s, paths, reference) for name in names}
        for name, row in rows.items():
            row.prefill_ratio = row.prefill_tokens_per_s / rows["mlx-lm"].prefill_tokens_per_s
            row.decode_ratio = row.decode_tokens_per_s / rows["mlx-lm"].decode_tokens_per_s
            row.roofline_fraction = row.decode_tokens_per_s / report.roofline[name]["max_tokens_per_s"]
            report.rows.append(row)
    report.help_seconds = help_overhead()
    return report


def _median_row(name, n, results, load_s, paths, reference) -> BenchRow:
    runs = results[(name, n)]
    med = lambda attr: statistics.median(getattr(x, attr) for x in runs)  # noqa: E731
    return BenchRow(
        engine=name,
        path=paths[name],
        prompt_tokens=n,
        load_s=load_s[name],
        ttft_s=med("ttft_s"),
        prefill_tokens_per_s=med("prefill_tokens_per_s"),
        decode_tokens_per_s=med("decode_tokens_per_s"),
        peak_memory_bytes=None if runs[0].peak_memory_bytes is None else int(med("peak_memory_bytes")),
        same_tokens=all(x.tokens == reference for x in runs),
    )


def machine() -> str:
    import os
    import platform

    import mlx.core as mx

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mlx = f"mlx {mx.__version__} ({mx.default_device()})"
    return f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores, {mlx}"
