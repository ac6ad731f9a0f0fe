"""The engine's thread: the one thread that runs a server's model (MLX evaluates an array on the thread
whose stream made it), kept for the next engine once a Batcher closes."""

from __future__ import annotations

import logging
import queue
import threading
import traceback
from typing import Callable

import mlx.core as mx

log = logging.getLogger("mlxinfer.server")


def settle(model) -> None:
    """Evaluate every array the model holds, here, on the thread that built it: MLX cannot evaluate on
    one thread a lazy array made on another ("There is no Stream(cpu, 0) in current thread"), and a
    module may keep one outside its parameters (model.RoPE's llama3 frequencies, `_freqs`)."""
    held = [v for _, m in model.named_modules() for v in m.values() if isinstance(v, mx.array)]
    mx.eval(model.parameters(), held)


# A thread that ran MLX's compiled functions (nn.silu, our swiglu) and then exits makes the process
# abort at exit ("terminate called without an active exception", MLX 0.32.4). So engine threads never
# exit: a closed Batcher's thread parks and serves the next Batcher (tests make several apps).
_IDLE: "queue.SimpleQueue[queue.SimpleQueue]" = queue.SimpleQueue()


def on_engine_thread(fn: Callable[[], None]) -> None:
    try:
        inbox = _IDLE.get_nowait()
    except queue.Empty:
        inbox = queue.SimpleQueue()
        threading.Thread(target=_engine_thread, args=(inbox,), name="mlxinfer-engine", daemon=True).start()
    inbox.put(fn)


def _engine_thread(inbox: "queue.SimpleQueue") -> None:
    while True:
        fn = inbox.get()
        try:
            fn()
        except Exception:  # noqa: BLE001 - logged; the thread stays for the next engine
            log.error("engine thread:\n%s", traceback.format_exc())
        _IDLE.put(inbox)
