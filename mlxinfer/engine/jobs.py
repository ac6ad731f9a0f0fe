"""What the engine holds for a request: its job (rows, seeds, listener), each row in flight, and the
row groups of mlx-lm's classes (one B-row cache per request). batcher.py runs them."""

from __future__ import annotations

import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import mlx.core as mx

from ..errors import MlxinferError
from ..model.cache import keep_rows
from .decode import RowState
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


class ServedRow(RowState):
    """decode.RowState that keeps a failing processor (a grammar that gives up) to its own row: the
    error is recorded, the step goes on for the others, and the row ends with the error after it."""

    error: Optional[str] = None

    def scores(self, logits: mx.array, fed: mx.array, fast: bool = False) -> mx.array:
        try:
            return super().scores(logits, fed, fast)
        except Exception as e:  # noqa: BLE001 - any processor failure ends this row only
            self.error = f"{type(e).__name__}: {e}" if not isinstance(e, MlxinferError) else str(e)
            return logits - mx.logsumexp(logits, keepdims=True)


class LiveRow:
    """A row in flight: its job, its index in the job, its sampler state, cache and last token."""

    __slots__ = ("job", "index", "row", "cache", "group", "token", "text", "tokens")

    def __init__(self, job: Job, index: int, row: ServedRow, cache, group, token: int):
        self.job, self.index, self.row, self.cache, self.group, self.token = job, index, row, cache, group, token
        self.text: list[str] = []  # kept for a constrained row's JSON check at its end
        self.tokens: list[int] = []


class RowGroup:
    """mlx-lm's classes: one request's rows share one B-row cache (they have the same length)."""

    def __init__(self, cache: list):
        self.cache = cache
        self.members: list[LiveRow] = []


def groups(live: list[LiveRow]) -> list[RowGroup]:
    """The groups in the order their rows appear (each group's rows are contiguous in `live`)."""
    seen: dict[int, RowGroup] = {}
    for m in live:
        seen.setdefault(id(m.group), m.group)
    return list(seen.values())


def shrink_groups(before: list[LiveRow], after: list[LiveRow]) -> None:
    """mlx-lm's classes: drop the rows that left from their group's B-row cache."""
    staying = {id(m) for m in after}
    for group in groups(before):
        kept = [p for p, m in enumerate(group.members) if id(m) in staying]
        if len(kept) < len(group.members):
            if kept:
                group.cache = keep_rows(group.cache, kept)
            group.members = [group.members[p] for p in kept]
