"""Ranks that share one model (MLX's `mx.distributed`, started by `mlx.launch`): connecting them,
what they must agree on before a weight is read, and how the load ends on every rank.

- connect: `mx.distributed.init` with a deadline. MLX's ring backend waits for its peers without
  one on the accepting side; here a rank that cannot reach the others gives up after
  MLXINFER_CONNECT_TIMEOUT seconds (default 60) with one line.
- preflight: every rank resolves the model and fingerprints it (formats/fingerprint.py); the
  fingerprints are all_gathered, so that ranks holding different models, or a rank that cannot
  open its model, stop every rank with one line before any weight is read. Then the split plan
  (counting/split.py) is checked: too many ranks, or a cut inside a quantization group.
- finish: shard (shard.py), agree on one compute dtype, and gather each rank's bytes for the report.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from dataclasses import replace

import mlx.core as mx
from mlx.utils import tree_flatten

from ..counting import split
from ..errors import MlxinferError
from ..formats import gguf, safetensors, sources
from ..formats.config import ModelConfig
from ..formats.fingerprint import PARTS, fingerprint
from . import convert, dtype_rule, params
from .shard import shard

TIMEOUT_ENV = "MLXINFER_CONNECT_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
STUCK_S = 30.0  # how long a rank may stay held in a call to MLX after Ctrl-C or SIGTERM before it is ended
_group = None
_keep: list = []  # the wakeup socket pair, open for the process's life


def connect(timeout: float | None = None):
    """This process's group: what mlx.launch set up, or a single rank outside it. Cached."""
    global _group
    if _group is None:
        _group = _init(timeout if timeout is not None else _timeout())
        if _group.size() > 1:
            _exit_if_stuck(_group.rank())
    return _group


def _exit_if_stuck(rank: int, grace: float = STUCK_S) -> None:
    """After Ctrl-C, a rank whose peer has stopped can wait for ever inside an MLX collective (the ring fails
    its sockets but not the pending all_reduce), where Python never runs the SIGINT handler, so no
    KeyboardInterrupt; mlx.launch then waits with it. Python's C-level handler writes each signal to a wakeup
    fd from any thread, so a watcher thread hears it even then: if the Python handler has not run `grace`
    seconds after a Ctrl-C (or the process is still there that long after SIGTERM), the process ends. A rank
    whose Python takes the interrupt (and returns what it found, or goes on) is left alone. Bytes for a wakeup
    fd set before this one are passed on to it."""
    if threading.current_thread() is not threading.main_thread():
        return  # set_wakeup_fd and signal handlers are the main thread's
    read, write = socket.socketpair()
    write.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(write.fileno(), warn_on_full_buffer=False)
    except ValueError:
        return
    handler, taken = signal.getsignal(signal.SIGINT), [0]  # Ctrl-Cs the Python handler has run for

    def on_sigint(signum, frame):
        taken[0] += 1
        if callable(handler):
            return handler(signum, frame)
        raise KeyboardInterrupt

    if handler not in (signal.SIG_IGN, None):  # an ignored Ctrl-C stays ignored
        signal.signal(signal.SIGINT, on_sigint)

    def watch():
        sent = 0  # Ctrl-Cs heard here
        while True:
            data = read.recv(64)
            if previous != -1:
                with contextlib.suppress(OSError):
                    os.write(previous, data)
            sent += data.count(signal.SIGINT)
            if signal.SIGTERM in data:  # SIGTERM: a process still here after the grace period ends in any case
                time.sleep(grace)
            elif signal.SIGINT in data:
                end = time.monotonic() + grace
                while time.monotonic() < end and taken[0] < sent:
                    time.sleep(0.05)
                if taken[0] >= sent:
                    continue
            else:
                continue
            code = 143 if signal.SIGTERM in data else 130
            os.write(2, f"mlxinfer: rank {rank} was still held in a call to MLX {grace:g} s after the "
                        f"signal (waiting on the other ranks); it exits\n".encode())  # fmt: skip
            os._exit(code)

    threading.Thread(target=watch, name="mlxinfer-stuck-rank", daemon=True).start()
    _keep.append((read, write))


def _timeout() -> float:
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise MlxinferError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds above 0; unset it or give e.g. 120")
    return seconds


def _init(seconds: float):
    if threading.current_thread() is not threading.main_thread():
        return mx.distributed.init()  # signals reach the main thread only: no deadline here
    fired = []
    # the alarm interrupts the blocking accept() (EINTR), and MLX raises; the handler only notes it
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    started = time.monotonic()
    try:
        return mx.distributed.init()
    except RuntimeError as e:
        rank = os.environ.get("MLX_RANK", "?")
        if fired and time.monotonic() - started < seconds + 1:  # our deadline ended the wait
            why, longer = f"within {seconds:g} s", f", or give slow starters longer with {TIMEOUT_ENV}=SECONDS"
        else:  # MLX's own retries gave up (a rank that connects to rank 0 tries for ~30 s, whatever the deadline)
            why, longer = f"after {time.monotonic() - started:.0f} s ({' '.join(str(e).split())})", ""
        raise MlxinferError(
            f"rank {rank} could not reach the other ranks {why}; start every rank (mlx.launch does), check the "
            f"hosts' addresses and ports{longer}"
        ) from None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def preflight(source, group) -> split.SplitPlan | None:
    """Before any weight is read: the same model on every rank, and a split that works for group.size()."""
    digests, failure, opened = [bytes(8)] * len(PARTS), None, None
    try:
        src = sources.resolve(source)
        if src.kind == "config":
            raise MlxinferError(f"{src.path} is a config file alone; point at the model directory", "source")
        header = gguf.read_header(src.path, tokenizer=False) if src.kind == "gguf" else None
        digests = fingerprint(src, header.data_offset if header else None)
        opened = (src, header)
    except MlxinferError as e:
        failure = e  # still take part in the exchange, so that the other ranks learn of it and stop too
    mine = mx.array([[0 if failure else 1, *b"".join(digests)]], dtype=mx.uint8)
    try:
        rows = mx.distributed.all_gather(mine, group=group).tolist()
    except RuntimeError as e:
        raise MlxinferError(f"rank {group.rank()} lost the other ranks while comparing models ({e})") from None
    if failure is not None:
        raise failure
    failed = [i for i, row in enumerate(rows) if row[0] == 0]
    if failed:
        raise MlxinferError(
            f"rank {failed[0]} could not open the model (its own error line says why); give every rank the same model",
            "source",
        )
    for i, row in enumerate(rows):
        for k, part in enumerate(PARTS):
            if row[1 + 8 * k : 9 + 8 * k] != rows[0][1 + 8 * k : 9 + 8 * k]:
                raise MlxinferError(
                    f"ranks disagree on the model: rank {i}'s {part} differ from rank 0's; "
                    "give every rank a copy of the same model",
                    "source",
                )
    src, header = opened
    cfg = (
        gguf.config_from_header(header) if header else ModelConfig.from_file(src.path / "config.json", undescribed=True)
    )
    if not (cfg.architecture and cfg.architecture.ours):
        return None  # mlx-lm's class splits itself (its shard method checks the head counts)
    files = None if header else safetensors.local_files(src.path)
    return split.plan(cfg, group.size(), split.column_groups(cfg, files, header))


def finish(model, group, compute_dtype: str):
    """Shard a model whose weights are loaded lazily, then apply one compute dtype on every rank
    (float32 only where every rank would pick it) and record the split in model.info.sharding."""
    one_process = {"bfloat16": _nbytes(model), "float32": params.float32_nbytes(model)}
    how = shard(model, group)
    mx.eval(model.parameters())  # the parts every rank keeps whole: embedding, norms, output table
    wanted = dtype_rule.choose_compute_dtype(compute_dtype, params.float32_nbytes(model))
    votes = mx.distributed.all_gather(mx.array([wanted == "float32"], dtype=mx.int32), group=group)
    dtype = "float32" if all(votes.tolist()) else "bfloat16"
    convert.apply(model, dtype)
    mine = mx.array([[_nbytes(model), mx.get_active_memory()]], dtype=mx.int64)
    held = mx.distributed.all_gather(mine, group=group).tolist()
    shares = how.get("shares") or [{"rank": r} for r in range(group.size())]
    how["shares"] = [{**s, "weight_bytes": w, "active_bytes": a} for s, (w, a) in zip(shares, held)]
    how["one_process_weight_bytes"] = one_process[dtype]
    model.info = replace(model.info, sharding=how)
    return model


def _nbytes(model) -> int:
    return sum(p.nbytes for _, p in tree_flatten(model.parameters()))
