"""Continuous batching: one engine thread owns the model; requests join and leave between steps.

Each loop of the engine thread admits the queued requests that fit (their prompts prefilled, or
forked from the prompt cache, their first tokens drawn from the prefill's scores, exactly as
decode.decode draws them), then decodes one token for every row in flight, and drops the rows that
finished or whose client went away. A prompt is prefilled `prefill_budget` tokens at a time, and
between two chunks the rows in flight take a step and queued prompts that fit in one chunk are
admitted: a long prompt delays the others by a chunk, not by its whole prefill (chunks of any size
give a prompt the same bits on our paths). Which rows go on is decided as soon as a step's tokens are
drawn; the tokens reach their clients (detokenized, told) while the next step's forward runs.
On our own definitions (model/ragged.py) every row has a one-row KV cache of its own and one forward
pass serves all rows; mlx-lm's classes run one forward per request over that request's rows.

The rows are the row core's (core.py): the same Row, stop rules and draw as decode.py's, so a row
draws what it would draw alone: `mlxinfer.sample(..., seeds=[s])` gives the same text, bit for bit
where the forward pass gives a row the same bits alone or in a batch (the weights as stored, on
MLX's CPU back end). What the engine holds for a request (its job): jobs.py.

`call(fn)` runs any function on the engine thread between two steps (the explorer's forward passes, the
exact answers' walk, a pass at a time). Events go to each job's `emit(kind, row, payload)`, called on the
engine thread:
  ("step", i, Step)              a token (Step.token set) or the end (token None, finish_reason)
  ("json", i, JsonResult)        right after a constrained row's end: the parsed JSON
  ("error", None, (status, msg)) the job ended without finishing (the model's scores, a bug)
"""

from __future__ import annotations

import collections
import logging
import threading
import time
import traceback
from concurrent.futures import Future
from typing import Any, Callable

import mlx.core as mx

from ..cpu import draw as cpu_draw
from ..defaults import SERVE_MAX_QUEUE, SERVE_MAX_ROWS, SERVE_PROMPT_CACHE_BYTES
from ..errors import MlxinferError, check_whole
from .core import Batch, Drawn, Row, alternatives_of
from .decode import others_between_chunks, prefill
from .engine_thread import on_engine_thread, settle
from .jobs import Job
from .prompt_cache import PromptCache

log = logging.getLogger("mlxinfer.server")


def check_bounds(max_rows, max_queue, prompt_cache_bytes) -> None:
    """The engine's bounds (the server checks them before a model loads)."""
    check_whole(max_rows, "max_rows", 1, "at least 1")
    check_whole(max_queue, "max_queue", 0, "0 (no queue) or more")
    check_whole(prompt_cache_bytes, "prompt_cache_bytes", 0, "0 (no prompt cache) or more")


class CallAbandoned(Exception):
    """A call's client left while it ran: it stops at its prefill's next chunk."""


class QueueFull(Exception):
    """More requests are waiting than the queue bound allows: the caller should retry later."""


class EngineStopped(QueueFull):
    """The engine is shutting down: no request is taken any more (a server's 503, not a 429)."""


class _Left(Exception):
    """The job's client left while its prompt was being prefilled: the rest of the prefill is skipped."""


class Batcher:
    """The engine: `submit` from any thread, events back through each job's `emit`."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_rows: int = SERVE_MAX_ROWS,
        max_queue: int = SERVE_MAX_QUEUE,
        prefill_budget: int = 512,
        step_timeout: float = 0.5,
        prompt_cache_bytes: int = SERVE_PROMPT_CACHE_BYTES,
    ):
        check_bounds(max_rows, max_queue, prompt_cache_bytes)
        self.model, self.tokenizer = model, tokenizer
        self.max_rows, self.max_queue, self.prefill_budget = max_rows, max_queue, prefill_budget
        # a request's rows at most: half, so that one request (n = max_rows, thousands of tokens) never holds every
        # row while the others wait for all of it to end
        self.max_request_rows = max(1, max_rows // 2)
        self.batch = Batch(model, tokenizer, own_caches=True)
        self.per_row = self.batch.own  # one forward for all rows; else one per request
        self._pending: collections.deque[Job] = collections.deque()
        self._calls: collections.deque[tuple[Callable[[], Any], Future]] = collections.deque()
        self._live: list[Row] = []  # each row's `owner` is its Job, its `index` its place in the job
        self._undelivered: list[tuple] = []  # (row, token, logprob, alternatives, finish reason) decided, not yet told
        self._cv = threading.Condition()
        self._closed = False
        self._idle_wait = step_timeout
        self.steps = 0  # decode steps run (for /health and the bench)
        self.tokens = 0
        self._prompts = PromptCache(prompt_cache_bytes)
        self._clock = time.perf_counter  # a test's own clock for the turns between chunks
        self._turn_ended = 0.0  # when the rows in flight last had their turn beside a long prefill
        self._stopped = threading.Event()
        self._prefilling = 0
        settle(model)
        cpu_draw.available()  # its check at first use (~60 ms) now, not in the first step of many rows
        on_engine_thread(self._run)

    # ------------------------------------------------------------------------- any thread
    def submit(self, job: Job) -> Job:
        if len(job.seeds) > self.max_request_rows:
            raise MlxinferError(f"n must be at most {self.max_request_rows}, got {len(job.seeds)}", "n")
        with self._cv:
            self._check_room(len(job.seeds))
            self._pending.append(job)
            self._cv.notify()
        return job

    def call(self, fn: Callable[[], Any]) -> Future:
        """Run fn() on the engine thread between two steps (MLX runs on that thread alone: a forward pass
        elsewhere would run beside the steps); its result or exception in the Future. Calls wait in
        order, at most one between two steps, and count against the queue's bound. A call cancelled
        (Future.cancel) before it runs does not run; one abandoned while it runs (`abandon`) stops at its
        prefill's next chunk."""
        future: Future = Future()
        with self._cv:
            self._check_room(None)
            self._calls.append((fn, future))
            self._cv.notify()
        return future

    def _check_room(self, rows: int | None) -> None:
        """QueueFull where a new job of `rows` rows (None: a call) would have to wait and max_queue others
        already do. What starts at the engine's next turn does not wait: the queued jobs that fit in the free
        rows, first come first served, and one call. The explorer's calls wait in the same queue."""
        if self._closed:
            raise EngineStopped("the engine is shutting down")
        free, jobs_waiting = self.max_rows - len(self._live), 0
        for job in self._pending:
            if job.cancelled:
                continue
            if jobs_waiting or len(job.seeds) > free:
                jobs_waiting += 1
            else:
                free -= len(job.seeds)
        waiting = jobs_waiting + max(0, len(self._calls) - 1)
        waits = bool(self._calls) if rows is None else bool(jobs_waiting) or rows > free
        if waits and waiting >= self.max_queue:
            raise QueueFull(
                "nothing may wait: max_queue is 0"
                if self.max_queue == 0
                else f"{waiting} request{'s are' if waiting != 1 else ' is'} already waiting"
            )

    def status(self) -> dict:
        with self._cv:  # (the engine thread changes the queue under this lock)
            return {
                "rows_in_flight": len(self._live),
                "prefilling": self._prefilling,  # requests being prefilled: neither queued nor in flight
                "queued": sum(not job.cancelled for job in self._pending),  # a job whose client left waits for nothing
                "max_rows": self.max_rows,
                "max_request_rows": self.max_request_rows,
                "max_queue": self.max_queue,
                "steps": self.steps,
                "tokens": self.tokens,
                "per_row_attention": self.per_row,
                "prompt_cache": self._prompts.status(),
            }

    def stop(self) -> None:
        """Stop taking work, at once, from any thread: the engine ends at its next step or prefill chunk, and
        every request still waiting or in flight hears 503 "the server is shutting down"."""
        with self._cv:
            self._closed = True
            self._cv.notify()

    def close(self, timeout: float = 10.0) -> bool:
        """stop(), then wait for the engine thread to end (at most `timeout` seconds); whether it ended."""
        self.stop()
        return self._stopped.wait(timeout)

    @property
    def stopping(self) -> bool:
        """stop() was called (the engine may still be ending its step)."""
        return self._closed

    @property
    def running(self) -> bool:
        """The engine thread is taking work: not stopped, not ended (a bug that ended it would show here)."""
        return not self._closed and not self._stopped.is_set()

    # ------------------------------------------------------------------------- the engine thread
    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self._live = []
            self._stopped.set()

    def _loop(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._pending and not self._live and not self._calls:
                    self._cv.wait(self._idle_wait)
                if self._closed:
                    break
                jobs = self._next_jobs()
                call = self._calls.popleft() if self._calls else None
            if jobs or call:
                self._deliver()  # the last step's tokens first: the prefills below would hold them back
            for job in jobs:
                self._admit(job)
            if call is not None:
                self._run_call(*call)
            self._drop_finished()
            if self._live:
                self._step()
            if not self._live:
                self._deliver()
        self._deliver()
        for row in self._live:  # shutting down: whoever still waits hears why
            self._fail(row.owner, 503, "the server is shutting down")
        for job in self._pending:
            self._fail(job, 503, "the server is shutting down")
        for _, future in self._calls:
            if future.set_running_or_notify_cancel():
                future.set_exception(EngineStopped("the engine is shutting down"))

    def _next_jobs(self, reserved: int = 0, within_budget: bool = False) -> list[Job]:
        """The queued jobs to prefill before the next step, first come first served: those that fit
        beside the rows in flight (and `reserved` rows more), up to `prefill_budget` prompt tokens (at
        least one job, unless `within_budget`). Several at once shorten the ramp when many requests
        arrive together; the budget bounds how long the rows in flight wait for their next token. A
        prompt the prompt cache holds, or one already taken this time, costs nothing (a fork): an
        experiment's requests on one prompt join in one step. Cancelled jobs are dropped."""
        jobs, rows, tokens, taken = [], len(self._live) + reserved, 0, set()
        while self._pending:
            job = self._pending[0]
            if job.cancelled:
                self._pending.popleft()
                continue
            ids = tuple(job.request.ids)
            n = 0 if ids in taken or self._prompts.holds(ids) else len(ids)
            over = tokens + n > self.prefill_budget and (jobs or within_budget)
            if rows + len(job.seeds) > self.max_rows or over:
                break
            jobs.append(self._pending.popleft())
            rows, tokens = rows + len(job.seeds), tokens + n
            taken.add(ids)
        return jobs

    def _admit(self, job: Job, between_chunks: bool = True) -> None:
        """Prefill the job's prompt once and draw each row's first token from its scores; between two
        chunks of the prefill, the others' turn (`_between_chunks`)."""
        request = job.request

        def progress(done: int, total: int) -> None:
            self._stop_if_gone(job)
            if between_chunks and done < total:
                self._between_chunks(len(job.seeds))

        self._turn_ended = self._clock()
        self._prefilling += 1
        try:
            self._stop_if_gone(job)  # it may have left (or the engine stopped) while the jobs before it were prefilled
            prefilled = self._prompts.get(request.ids) or self._prompts.put(
                prefill(self.model, request.ids, step_size=self.prefill_budget, progress=progress)
            )
            rows = self.batch.admit(prefilled, [request.row(seed) for seed in job.seeds])
            for row in rows:
                row.owner = job
            last = mx.array(request.ids[-1:], dtype=mx.int32)
            fed = [last] * len(rows)
            drawn = self.batch.draw(rows, prefilled.logits, fed, job.top_logprobs, job.logprobs, host_draw=True)
            mx.eval(*drawn.arrays())
        except _Left:  # between two chunks of its prefill (decode.prefill's step_size tokens)
            if self._closed:
                self._fail(job, 503, "the server is shutting down")
            return
        except MlxinferError as e:  # the prefill's scores are NaN or inf: the model's fault, named
            self._fail(job, 500, str(e))
            return
        except Exception as e:  # noqa: BLE001 - a bug: this job ends, the engine goes on
            log.error("prefill failed:\n%s", traceback.format_exc())
            self._fail(job, 500, f"internal error during prefill ({type(e).__name__})")
            return
        finally:
            self._prefilling -= 1
        self._live.extend(self._decide(rows, drawn))
        self._deliver()

    def _stop_if_gone(self, job: Job) -> None:
        """_Left where the job's client left, or the engine is stopping: the rest of its prefill is not run."""
        if job.cancelled or self._closed:
            raise _Left

    def abandon(self, future: Future) -> None:
        """No one waits for call's `future` any more: not run if it has not started, else stopped at its
        prefill's next chunk (CallAbandoned, to a future no one reads)."""
        future.abandoned = True
        future.cancel()

    def _run_call(self, fn: Callable[[], Any], future: Future) -> None:
        """fn() for `call`, its result or error to the future; a long prompt it prefills goes in chunks of
        prefill_budget tokens with the rows in flight stepping between them (was: every stream held for
        the whole prefill, over a minute for 5,000 tokens)."""
        if not future.set_running_or_notify_cancel():
            return  # cancelled while it waited

        def turn() -> None:
            if getattr(future, "abandoned", False):
                raise CallAbandoned
            if self._closed:
                raise EngineStopped("the engine is shutting down")
            self._between_chunks(0)

        self._turn_ended = self._clock()
        self._prefilling += 1
        try:
            with others_between_chunks(turn, self.prefill_budget):
                future.set_result(fn())
        except BaseException as e:  # noqa: B036 - handed to the caller, who re-raises it
            future.set_exception(e)
        finally:
            self._prefilling -= 1

    def _between_chunks(self, reserved: int) -> None:
        """While a long prompt is prefilled: queued prompts that fit in one chunk are admitted (beside the
        `reserved` rows the long one will need), and the rows in flight step for as long as the chunk before
        took (at least once), so that a long prompt and the streams share the engine's time about evenly.
        Was: one step a chunk, so beside a 6,000-token prompt (~4 s a chunk here) a stream got a token every
        few seconds."""
        now = self._clock()
        until = now + (now - self._turn_ended)  # as long again as the chunk took
        while True:
            with self._cv:
                jobs = self._next_jobs(reserved, within_budget=True)
            for job in jobs:
                self._admit(job, between_chunks=False)
            self._drop_finished()
            if self._live:
                self._step()
            if not self._live or self._clock() >= until or self._closed:
                break
        self._deliver()
        self._turn_ended = self._clock()

    def _step(self) -> None:
        live = self._live
        try:
            tokens = mx.array([r.token for r in live], dtype=mx.int32)
            logits = self.batch.forward(live, tokens)
            mx.async_eval(logits)  # the forward runs while the draw is set up (keys, masks)
            self._deliver()  # and while the last step's tokens go to their clients
            top = max(r.owner.top_logprobs for r in live)
            want = any(r.owner.logprobs for r in live)
            drawn = self.batch.draw(live, logits, tokens, top, want, host_draw=True)
            mx.eval(*drawn.arrays())
        except Exception as e:  # noqa: BLE001 - the step failed for everyone in it: end them, go on
            log.error("decode step failed:\n%s", traceback.format_exc())
            self._deliver()  # what they drew before it, then the error
            for job in {id(r.owner): r.owner for r in live}.values():
                self._fail(job, 500, f"internal error during decode ({type(e).__name__})")
            return
        self.steps += 1
        self._live = self._decide(live, drawn)

    def _decide(self, rows: list[Row], drawn: Drawn) -> list[Row]:
        """Which rows go on after these tokens (core.Row.decide), their hand-over queued for `_deliver`:
        the next step's forward can start before the clients hear of this one. A row whose scores
        were not finite, or whose grammar failed, ends its whole request."""
        tokens, chosen = drawn.tokens.tolist(), drawn.logprobs.tolist()
        finite = drawn.finite.tolist() if drawn.finite is not None else [True] * len(rows)
        keep = []
        for p, row in enumerate(rows):
            job = row.owner
            if job.gone(row.index) or row.ended:  # cancelled, or a stop string ended it when it was told
                continue
            before = row.generated
            reason = row.decide(tokens[p], finite[p])
            self.tokens += row.generated - before
            if reason == "error":
                self._fail(job, 500, f"{row.error}; this request was ended")
                continue
            alts = drawn.alternatives[p] if drawn.alternatives else None
            self._undelivered.append((row, tokens[p], chosen[p], alts, reason))
            if reason is None:
                row.token = tokens[p]
                keep.append(row)
        self.batch.keep(rows, keep)
        return keep

    def _deliver(self) -> None:
        """Hand the decided tokens to their jobs: text, log-probability and alternatives, then for a
        row that ended its last piece and reason (and a constrained row's JSON)."""
        queued, self._undelivered = self._undelivered, []
        for row, token, chosen, alts, reason in queued:
            job = row.owner
            if job.cancelled:
                continue
            k = job.top_logprobs
            alternatives = alternatives_of(self.tokenizer, alts)[:k] if k and alts is not None else []
            for step in row.take(token, chosen, alternatives, reason):
                job.tell("step", row.index, step)
            if row.ended and row.spec.mask is not None:
                try:
                    checked = row.json()
                except Exception as e:  # noqa: BLE001 - the grammar accepted non-JSON: a bug, this row only
                    self._fail(job, 500, f"constrained decoding failed: {e}")
                    continue
                job.tell("json", row.index, checked)

    def _drop_finished(self) -> None:
        """Rows whose client left, or that a stop string ended, leave before the next pass."""
        if any(r.owner.gone(r.index) or r.ended for r in self._live):
            keep = [r for r in self._live if not (r.owner.gone(r.index) or r.ended)]
            self.batch.keep(self._live, keep)
            self._live = keep

    def _fail(self, job: Job, status: int, message: str) -> None:
        if not job.cancelled:
            job.cancelled = True  # its other rows leave too
            job.tell("error", None, (status, message))
