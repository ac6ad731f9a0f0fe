"""What the engine holds for a request: its job (seeds, listener, cancellation). Its rows in flight are
the row core's (core.Row, each with the job as its `owner`); batcher.py runs them."""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .request import Request

log = logging.getLogger("mlxinfer.server")


@dataclass
class Job:
    """One request in the engine: its rows (one per seed) and where their events go."""

    request: Request
    seeds: list[int]
    emit: Callable[[str, Optional[int], Any], None]
    logprobs: bool = False  # whether the tokens' log-probabilities are read
    top_logprobs: int = 0  # alternatives per token
    cancelled: bool = False  # set from any thread: the rows leave at the next step
    dropped: set = field(default_factory=set)  # rows no one reads any more (a stop string matched)
    submitted: float = field(default_factory=time.perf_counter)

    def cancel(self) -> None:
        self.cancelled = True

    def drop(self, index: int) -> None:
        """Row `index` is done for the caller: it leaves at the next step (the others go on)."""
        self.dropped.add(index)

    def gone(self, index: int) -> bool:
        return self.cancelled or index in self.dropped

    def tell(self, kind: str, index: Optional[int], payload: Any) -> None:
        """emit, contained: a listener that fails (its event loop closed) ends this job, not the engine."""
        try:
            self.emit(kind, index, payload)
        except Exception:  # noqa: BLE001 - whoever listened is gone
            log.warning("a job's listener failed; the job ends:\n%s", traceback.format_exc())
            self.cancelled = True
