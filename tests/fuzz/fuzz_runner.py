"""Turn a drawn case into files and one `python -m mlxinfer ...` subprocess, and judge what came back.

The rule every case must keep (README: bad input is one line on stderr and exit code 2):
exit 0 or 2 (1 only for `generate` JSON cut by --max-tokens, which says so), never a signal or a
time-out, no traceback, exactly one `error: ...` line on stderr with exit 2, strict JSON on stdout
with --json, and no `.OUT.partial-*` left behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import fuzz_strategies as strategies
import hostile
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
MEMORY_LIMIT = 4 << 30  # address space per case: a file of a few hundred KB must not need more
# `python -m mlxinfer ARGS` under that limit (set in the child itself: preexec_fn is unsafe with threads)
LAUNCH = (
    "import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, ({0}, {0})); "
    "sys.argv[0] = 'mlxinfer'; runpy.run_module('mlxinfer', run_name='__main__')"
).format(MEMORY_LIMIT)


@dataclass
class Bases:
    """The valid inputs every mutation starts from: tiny llama checkpoints (bf16, 4-bit) and its GGUF with
    its matrices in Q8_0 (the mutations' reference), Q4_1 (the embedded model's type) or F16."""

    llama: Path
    llama4: Path
    ggufs: dict[str, hostile.GGUFSpec] = field(repr=False)

    @classmethod
    def make(cls, llama: Path, llama4: Path) -> "Bases":
        return cls(Path(llama), Path(llama4), {k: hostile.tiny_gguf(Path(llama), k) for k in ("Q8_0", "Q4_1", "F16")})

    @property
    def gguf(self) -> hostile.GGUFSpec:
        return self.ggufs["Q8_0"]

    def safetensors_names(self) -> list[str]:
        return sorted(hostile.read_safetensors(self.llama4 / "model.safetensors")[0])


def cases(bases: Bases) -> dict[str, st.SearchStrategy]:
    """One strategy per kind of input."""
    meta_keys = [k for k, _, _ in bases.gguf.metadata]
    return {
        "gguf": st.tuples(
            strategies.gguf_mutations(meta_keys, len(bases.gguf.tensors)),
            st.sampled_from(["count", "topk", "topk", "convert"]),
            st.sampled_from(["Q8_0", "Q4_1", "F16"]),
        ),
        "safetensors": st.tuples(
            strategies.safetensors_mutations(bases.safetensors_names()), st.sampled_from(["count", "topk"])
        ),
        "config": strategies.config_mutations,
        "schema": strategies.schema_case,
        "cli": strategies.cli_case,
    }


def draw(strategy: st.SearchStrategy, n: int, seed_value: int) -> list:
    """n cases from a strategy, reproducibly for a seed (Hypothesis generates; runner.py runs them)."""
    out: list = []

    @seed(seed_value)
    @settings(
        max_examples=n, database=None, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
    )
    @given(strategy)
    def collect(case):
        out.append(case)

    collect()
    return out[:n]


# ---------------------------------------------------------------------------------------------- files
def _gguf(bases: Bases, case, work: Path) -> Path:
    (ops, byte_ops), _, base = case
    spec = bases.ggufs[base].copy()
    auto = spec.offsets()
    for op in ops:
        kind, *args = op
        t = spec.tensors[args[0]] if kind in ("dims", "swap", "type", "offset", "name", "fill") else None
        if kind == "meta":
            spec.set_meta(args[0], *args[1])
        elif kind == "drop":
            spec.drop_meta(args[0])
        elif kind == "dims":
            t.dims = list(args[1])
        elif kind == "swap":
            t.dims = list(reversed(t.dims))
        elif kind == "type":
            t.type_id = args[1]
        elif kind == "offset":
            delta = args[1]
            t.offset = delta if delta > 64 else max(0, auto[args[0]] + delta)
        elif kind == "name":
            t.name = args[1]
        elif kind == "fill":
            t.data = (args[1] * len(t.data))[: len(t.data)]
        elif kind == "version":
            spec.version = args[0]
    data = bytearray(spec.to_bytes())
    for op in byte_ops:
        if op[0] == "flip" and data:
            data[min(int(op[1] * (spec.header_size - 1)), len(data) - 1)] = op[2]
        elif op[0] == "truncate":
            del data[int(op[1] * len(data)) :]
    path = work / "model.gguf"
    path.write_bytes(bytes(data))
    return path


def _safetensors(bases: Bases, case, work: Path) -> Path:
    (base, ops, byte_ops), _ = case
    model = work / "model"
    shutil.copytree(bases.llama4 if base == "4bit" else bases.llama, model)
    header, data = hostile.read_safetensors(model / "model.safetensors")
    for kind, *args in ops:
        name = args[0] if kind != "metadata" else "__metadata__"
        if kind != "metadata" and name not in header:
            continue
        if kind in ("dtype", "shape", "offsets") and isinstance(header[name], dict):
            header[name][{"offsets": "data_offsets"}.get(kind, kind)] = args[1]
        elif kind == "drop":
            del header[name]
        elif kind == "rename":
            header[args[1]] = header.pop(name)
        elif kind in ("entry", "metadata"):
            header[name] = args[-1]
    raw = bytearray(hostile.write_safetensors(model / "model.safetensors", header, data).read_bytes())
    n = struct.unpack("<Q", raw[:8])[0]
    for op in byte_ops:
        if op[0] == "flip" and len(raw) > 8:
            raw[min(8 + int(op[1] * (n - 1)), len(raw) - 1)] = op[2]
        elif op[0] == "length" and len(raw) >= 8:
            raw[:8] = struct.pack("<Q", op[1])
        elif op[0] == "truncate":
            del raw[int(op[1] * len(raw)) :]
    (model / "model.safetensors").write_bytes(bytes(raw))
    return model


def _config(bases: Bases, case, work: Path) -> Path:
    ops, _ = case
    model = work / "model"
    shutil.copytree(bases.llama, model)
    cfg = json.loads((model / "config.json").read_text())
    for kind, *args in ops:
        if kind == "set":
            cfg[args[0]] = args[1]
        elif kind == "drop":
            cfg.pop(args[0], None)
    (model / "config.json").write_text(json.dumps(cfg))
    for kind, *args in ops:
        if kind == "file":
            (model / args[0]).write_text(json.dumps(args[1]))
        elif kind == "text":
            (model / args[0]).write_text(args[1], errors="surrogatepass")
        elif kind == "template":
            try:
                tok = dict(json.loads((model / "tokenizer_config.json").read_text()))
            except ValueError:  # a "text" op wrote something else there
                tok = {}
            (model / "tokenizer_config.json").write_text(json.dumps({**tok, "chat_template": args[0]}))
    return model


def arguments(kind: str, case, bases: Bases, work: Path) -> list[str]:
    """Write the case's files under `work`; return the command line after `python -m mlxinfer`."""
    if kind in ("gguf", "safetensors", "config"):
        path = str({"gguf": _gguf, "safetensors": _safetensors, "config": _config}[kind](bases, case, work))
        command = case[1]
        if command == "count":
            return ["count", path, "--json"]
        if command == "convert":
            return ["convert", path, str(work / "out")]
        return ["topk", "-m", path, "-p", "Name one fruit.", "--json"]
    if kind == "schema":
        mode, schema, max_tokens = case
        value = {"name": "t", "description": "d", "input_schema": schema} if mode == "tool" else schema
        (work / "schema.json").write_text(json.dumps(value))
        flag = "--tool" if mode == "tool" else "--json-schema"
        args = ["generate", "-m", str(bases.llama), "-p", "hi", "--temp", "0", "--max-tokens", max_tokens, "--json"]
        return args + [flag, str(work / "schema.json")]
    command, options, flags, blob = case
    args = [command]
    args += {
        "count": [str(bases.llama)],
        "quantize": [str(bases.llama), str(work / "out")],
        "quality": [str(bases.llama), str(bases.llama)],
    }.get(command, ["-m", str(bases.llama)])
    given = {flag for flag, _ in options}
    for flag, value in options:
        if value == "BYTES":
            (work / "text.txt").write_bytes(blob)
            value = str(work / "text.txt")
        args += [flag, value]
    if command in ("topk", "generate", "sample") and "-p" not in given:
        args += ["-p", "hi"]
    if command == "sample" and not given & {"--seeds", "--seed-range"}:
        args += ["--seeds", "2"]
    if command in ("generate", "sample", "quality") and "--max-tokens" not in given:
        args += ["--max-tokens", "8"]
    return args + list(flags)


# ---------------------------------------------------------------------------------------------- running
@dataclass
class Outcome:
    kind: str
    args: list[str]
    returncode: int | None
    stderr: str
    seconds: float
    problem: str | None = None  # None: the case kept the rule


def run(kind: str, case, bases: Bases, work: Path, timeout: float = 60) -> Outcome:
    work.mkdir(parents=True, exist_ok=True)
    args = [a.replace("\x00", "") for a in arguments(kind, case, bases, work)]  # argv cannot carry NUL
    return execute(kind, args, work, timeout)


def execute(kind: str, args: list[str], work: Path, timeout: float = 60, launch: str = LAUNCH) -> Outcome:
    """`python -c LAUNCH ARGS` (mlxinfer, unless a test plants another program) in `work`, judged."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(work / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    start = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-c", launch, *args], cwd=ROOT, env=env, capture_output=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        stderr = (e.stderr or b"").decode(errors="replace")
        return Outcome(kind, args, None, stderr, time.monotonic() - start, f"hang: no exit within {timeout:.0f} s")
    out = Outcome(kind, args, done.returncode, done.stderr.decode(errors="replace"), time.monotonic() - start)
    out.problem = judge(out, done.stdout.decode(errors="replace"), work)
    return out


def judge(out: Outcome, stdout: str, work: Path) -> str | None:
    rc, err = out.returncode, out.stderr
    lines = [line for line in err.splitlines() if line.strip()]
    if rc < 0:
        return f"crash: killed by signal {-rc}"
    if "Traceback (most recent call last)" in err:
        return "traceback: " + (lines[-1] if lines else "")
    cut_json = rc == 1 and out.args[0] == "generate" and lines and lines[-1].startswith("warning: the output was cut")
    if rc not in (0, 2) and not cut_json:
        return f"exit {rc}: " + (lines[-1] if lines else "(no stderr)")
    if rc == 2 and (len(lines) != 1 or not lines[0].startswith("error: ")):
        return f"not one line: {len(lines)} lines on stderr, first {lines[:1]}"
    if rc in (0, 1) and "--json" in out.args:
        try:
            data = json.loads(stdout, parse_constant=_refuse)
        except ValueError as e:
            return f"not strict JSON on stdout: {e}"
        if out.args[0] == "topk" and not _probabilities(data):
            return "topk printed probabilities that are not numbers in [0, 1] (NaN shown as null?)"
    if rc == 0 and out.args[0] == "topk" and "--json" not in out.args and re.search(r"\bnan\b", stdout):
        return "topk printed nan in its table"
    left = [p.name for p in work.iterdir() if ".partial-" in p.name or ".old-" in p.name]
    if left:
        return f"left behind: {left}"
    return None


def _probabilities(table: dict) -> bool:
    """A next-token table's probabilities are numbers in [0, 1]: NaN scores must be an error, not a null."""
    values = [p for row in table["rows"] for p in row["probs"]] + table["mass"]
    return all(isinstance(p, float | int) and 0 <= p <= 1 + 1e-6 for p in values)


def _refuse(name):
    raise ValueError(f"{name} is not JSON")


def run_all(drawn: list[tuple[str, object]], bases: Bases, root: Path, workers: int = 2, timeout: float = 60):
    """Run (kind, case) pairs, `workers` subprocesses at a time; yields Outcomes in order."""

    def one(i_case):
        i, (kind, case) = i_case
        work = root / f"{i:05d}-{kind}"
        try:
            outcome = run(kind, case, bases, work, timeout)
        except Exception as e:  # the harness's own bug: reported, never mistaken for mlxinfer's
            return Outcome(kind, [], None, "", 0.0, f"harness: {type(e).__name__}: {e}")
        if outcome.problem is None:
            shutil.rmtree(work, ignore_errors=True)
        return outcome

    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield from pool.map(one, enumerate(drawn))
