"""Run a function on the engine's thread, between its steps: how the explorer's endpoints reach MLX.

MLX runs on one thread here, the batcher's (engine/batcher.py): a forward pass on any other thread
would run beside its steps. The batcher takes no lock that another thread could share, but it
promises that a job's `emit` is called on that thread, and a job's first event comes from its
admission (prompt prefilled, first token drawn), before the engine goes back to its rows in flight.
So a job of one row and one token is a ticket: its listener runs `fn` when that first event
arrives, hands the result to the event loop and cancels the job. The ticket waits in the same
queue as every other request (so a full queue is the same 429), and its prefill is not wasted:
the prompt cache keeps it for the draws and generations that follow on the same prompt.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, Callable

from ..engine.batcher import Batcher, Job, QueueFull
from ..engine.request import Request
from ..errors import MlxinferError
from .errors import ApiError, from_library

TICKET_SEED = 0  # the ticket's one row draws a token no one reads; any seed will do


async def on_engine(batcher: Batcher, request: Request, fn: Callable[[], Any]) -> Any:
    """fn() run on the engine thread once `request`'s prompt is admitted; its result, or its error
    (an MlxinferError as a 400, anything else as a 500). A client that leaves first cancels the ticket."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    ran = False

    def settle(result, error) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def emit(kind, index, payload) -> None:  # on the engine thread
        nonlocal ran
        if ran:
            return
        ran = True
        job.cancel()  # the row's other events are not read
        result, error = None, None
        if kind == "error":
            error = ApiError(payload[0], payload[1])
        else:
            try:
                result = fn()
            except MlxinferError as e:
                error = from_library(e)
            except Exception as e:  # noqa: BLE001 - a bug: this request ends, the engine goes on
                error = ApiError(500, f"internal error ({type(e).__name__}: {e})")
        loop.call_soon_threadsafe(settle, result, error)

    job = Job(replace(request, max_tokens=1), [TICKET_SEED], emit)
    try:
        batcher.submit(job)
    except QueueFull as e:
        raise ApiError(429, f"the server is busy ({e}); retry shortly", None, Retry_After="1") from None
    try:
        return await done
    finally:
        job.cancel()
