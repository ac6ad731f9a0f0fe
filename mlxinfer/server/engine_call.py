"""Run a function on the engine's thread, between its steps: how the explorer's endpoints reach MLX.

MLX runs on one thread here, the batcher's (engine/batcher.py): a forward pass on any other thread would
run beside its steps. `Batcher.call` queues the function with the requests (a full queue is the same 429)
and runs it between two steps; a client that leaves before it runs cancels it.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from ..engine.batcher import Batcher, QueueFull
from ..errors import MlxinferError
from .errors import ApiError, from_library, refused
from .inputs import POLL_S, ClientGone


async def on_engine(batcher: Batcher, fn: Callable[[], Any], http=None) -> Any:
    """fn() run on the engine thread; its result, or its error (an MlxinferError as a 400, a full queue as
    a 429, anything else as a 500). http (a Starlette request): while fn waits or runs, whether its client
    is still there, every POLL_S; gone, fn is dropped (a running one at its prefill's next chunk: a long
    prompt went on for a minute after its client left) and ClientGone raised."""
    try:
        future = batcher.call(fn)
    except QueueFull as e:
        raise refused(e) from None
    waiting = asyncio.wrap_future(future)
    try:
        while True:
            done, _ = await asyncio.wait({waiting}, timeout=POLL_S)
            if done:
                return waiting.result()
            if http is not None and await http.is_disconnected():
                batcher.abandon(future)
                raise ClientGone
    except MlxinferError as e:
        raise from_library(e) from None
    except QueueFull as e:
        raise ApiError(503, f"the server is shutting down ({e})", None) from None
    except (ApiError, ClientGone):
        raise
    except Exception as e:  # noqa: BLE001 - a bug: this request ends, the engine goes on
        raise ApiError(500, f"internal error ({type(e).__name__}: {e})") from None
    finally:
        waiting.cancel()  # the client left before it ran: it does not run
