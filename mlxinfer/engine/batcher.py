"""Continuous batching: one engine thread owns the model; requests join and leave between steps.

Each loop of the engine thread admits the queued requests that fit (their prompts prefilled, or
forked from the prompt cache, their first tokens drawn from the prefill's scores, exactly as
decode.decode draws them), then decodes one token for every row in flight, and drops the rows that
finished or whose client went away. Which rows go on is decided as soon as a step's tokens are
drawn; the tokens reach their clients (detokenized, told) while the next step's forward runs.
On our own definitions (model/rows.py) every row has a one-row KV cache of its own and one forward
pass serves all rows; mlx-lm's classes run one forward per request over that request's rows.
What it holds for each request (the job, its rows in flight, mlx-lm's row groups): jobs.py.

A row's sampler state is decode.py's `RowState`: its seed's key chain, its penalty history, its grammar
mask. The draw is decode.py's `choose_tokens` over all rows in flight, so a row draws what it would
draw alone: `mlxinfer.sample(..., seeds=[s])` gives the same text, bit for bit where the forward
pass gives a row the same bits alone or in a batch (the weights as stored, on MLX's CPU back end).

Events go to each job's `emit(kind, row, payload)`, called on the engine thread:
  ("step", i, Step)              a token (Step.token set) or the end (token None, finish_reason)
  ("json", i, JsonResult)        right after a constrained row's end: the parsed JSON
  ("error", None, (status, msg)) the job ended without finishing (the model's scores, a bug)
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import traceback
from typing import Callable

import mlx.core as mx

from ..cpu import draw as cpu_draw
from ..defaults import SERVE_MAX_QUEUE, SERVE_MAX_ROWS, SERVE_PROMPT_CACHE_BYTES
from ..errors import MlxinferError
from ..model import rows as row_walk
from ..model.cache import fork
from ..model.finite import finite_rows
from .decode import choose_tokens, prefill, top_alternatives
from .constrain import finish
from .jobs import Job, LiveRow, RowGroup, ServedRow, groups, shrink_groups
from .prompt_cache import PromptCache
from ..views import Step

log = logging.getLogger("mlxinfer.server")


def check_whole(value, name: str, least: int, what: str) -> None:
    """`value` is a whole number >= least, else a one-line error naming `name` ("must be {what}")."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise MlxinferError(f"{name} must be {what}, got {value!r}", name)


def check_bounds(max_rows, max_queue, prompt_cache_bytes) -> None:
    """The engine's bounds (the server checks them before a model loads)."""
    check_whole(max_rows, "max_rows", 1, "at least 1")
    check_whole(max_queue, "max_queue", 0, "0 (no queue) or more")
    check_whole(prompt_cache_bytes, "prompt_cache_bytes", 0, "0 (no prompt cache) or more")


class QueueFull(Exception):
    """More requests are waiting than the queue bound allows: the caller should retry later."""


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
        self.per_row = row_walk.supports(model)  # one forward for all rows; else one per request
        self.fast = model.info.cpu_kernels
        self.stop_ids = set(tokenizer.eos_token_ids)
        self._pending: collections.deque[Job] = collections.deque()
        self._live: list[LiveRow] = []
        self._undelivered: list[tuple] = []  # (row, token, logprob, alternatives, finish reason) decided, not yet told
        self._cv = threading.Condition()
        self._closed = False
        self._idle_wait = step_timeout
        self.steps = 0  # decode steps run (for /health and the bench)
        self.tokens = 0
        self._prompts = PromptCache(prompt_cache_bytes)
        self._stopped = threading.Event()
        _settle(model)
        cpu_draw.available()  # its check at first use (~60 ms) now, not in the first step of many rows
        _on_engine_thread(self._run)

    # ------------------------------------------------------------------------- any thread
    def submit(self, job: Job) -> Job:
        if len(job.seeds) > self.max_rows:
            raise MlxinferError(f"n must be at most {self.max_rows} (rows in flight), got {len(job.seeds)}", "n")
        with self._cv:
            if self._closed:
                raise QueueFull("the engine is shutting down")
            if len(self._pending) >= self.max_queue:
                raise QueueFull(f"{len(self._pending)} requests are already waiting")
            self._pending.append(job)
            self._cv.notify()
        return job

    def status(self) -> dict:
        return {
            "rows_in_flight": len(self._live),
            "queued": sum(not job.cancelled for job in self._pending),  # a job whose client left waits for nothing
            "max_rows": self.max_rows,
            "max_queue": self.max_queue,
            "steps": self.steps,
            "tokens": self.tokens,
            "per_row_attention": self.per_row,
            "prompt_cache": self._prompts.status(),
        }

    def close(self, timeout: float = 10.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._stopped.wait(timeout)

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
                while not self._closed and not self._pending and not self._live:
                    self._cv.wait(self._idle_wait)
                if self._closed:
                    break
                jobs = self._next_jobs()
            if jobs:
                self._deliver()  # the last step's tokens first: the prefills below would hold them back
            for job in jobs:
                self._admit(job)
            self._drop_cancelled()
            if self._live:
                self._step()
            if not self._live:
                self._deliver()
        self._deliver()
        for live in self._live:  # shutting down: whoever still waits hears why
            self._fail(live.job, 503, "the server is shutting down")
        for job in self._pending:
            self._fail(job, 503, "the server is shutting down")

    def _next_jobs(self) -> list[Job]:
        """The queued jobs to prefill before the next step, first come first served: those that fit
        beside the rows in flight, up to `prefill_budget` prompt tokens (at least one job). Several at
        once shorten the ramp when many requests arrive together; the budget bounds how long the rows
        in flight wait for their next token. A prompt the prompt cache holds, or one already taken
        this time, costs nothing (a fork): an experiment's requests on one prompt join in one step.
        Cancelled jobs are dropped."""
        jobs, rows, tokens, taken = [], len(self._live), 0, set()
        while self._pending:
            job = self._pending[0]
            if job.cancelled:
                self._pending.popleft()
                continue
            ids = tuple(job.request.ids)
            n = 0 if ids in taken or self._prompts.holds(ids) else len(ids)
            if rows + len(job.seeds) > self.max_rows or (jobs and tokens + n > self.prefill_budget):
                break
            jobs.append(self._pending.popleft())
            rows, tokens = rows + len(job.seeds), tokens + n
            taken.add(ids)
        return jobs

    def _admit(self, job: Job) -> None:
        """Prefill the job's prompt once and draw each row's first token from its scores."""
        request = job.request
        try:
            _stop_if_left(job)  # it may have left while the jobs taken before it were prefilled
            prefilled = self._prompts.get(request.ids) or self._prompts.put(
                prefill(self.model, request.ids, progress=lambda done, total: _stop_if_left(job))
            )
            history = mx.array(request.ids[:-1], dtype=mx.int32)
            rows = [ServedRow(request.row(seed), history, self.tokenizer, self.stop_ids) for seed in job.seeds]
            last = mx.array(request.ids[-1:], dtype=mx.int32)
            y, lp, alts = choose_tokens(
                rows, prefilled.logits, [last] * len(rows), job.top_logprobs, self.fast, job.logprobs, host_draw=True
            )
            mx.eval(y, lp, alts)
        except _Left:  # between two chunks of its prefill (decode.prefill's step_size tokens)
            return
        except MlxinferError as e:  # the prefill's scores are NaN or inf: the model's fault, named
            self._fail(job, 500, str(e))
            return
        except Exception as e:  # noqa: BLE001 - a bug: this job ends, the engine goes on
            log.error("prefill failed:\n%s", traceback.format_exc())
            self._fail(job, 500, f"internal error during prefill ({type(e).__name__})")
            return
        if self.per_row:
            members = [LiveRow(job, i, row, fork(prefilled.cache, 1), None, 0) for i, row in enumerate(rows)]
        else:
            group = RowGroup(fork(prefilled.cache, len(rows)))
            members = [LiveRow(job, i, row, None, group, 0) for i, row in enumerate(rows)]
            group.members = list(members)
        self._live.extend(self._decide(members, y.tolist(), lp.tolist(), alts))
        self._deliver()

    def _step(self) -> None:
        live = self._live
        try:
            tokens = mx.array([m.token for m in live], dtype=mx.int32)
            logits = self._forward(live, tokens)
            finite = finite_rows(logits)  # checked per row before any draw is shown
            mx.async_eval(logits, finite)  # the forward runs while the draw is set up (keys, masks)
            self._deliver()  # and while the last step's tokens go to their clients
            fed = [tokens[p : p + 1] for p in range(len(live))]
            top = max(m.job.top_logprobs for m in live)
            want = any(m.job.logprobs for m in live)
            y, lp, alts = choose_tokens([m.row for m in live], logits, fed, top, self.fast, want, host_draw=True)
            mx.eval(y, lp, alts, finite)
        except Exception as e:  # noqa: BLE001 - the step failed for everyone in it: end them, go on
            log.error("decode step failed:\n%s", traceback.format_exc())
            self._deliver()  # what they drew before it, then the error
            for job in {id(m.job): m.job for m in live}.values():
                self._fail(job, 500, f"internal error during decode ({type(e).__name__})")
            return
        self.steps += 1
        ok = finite.tolist()
        bad = {id(m.job): m.job for p, m in enumerate(live) if not ok[p]}
        for job in bad.values():
            self._fail(job, 500, "the model's scores became NaN or inf during decode; this request was ended")
        self._live = self._decide(live, y.tolist(), lp.tolist(), alts, skip=set(bad))

    def _forward(self, live: list[LiveRow], tokens: mx.array) -> mx.array:
        if self.per_row:
            # each row's cache is its own copy (cache.fork, KVCache.reserve), held by its LiveRow alone
            return row_walk.step(self.model, tokens, [m.cache for m in live], owned=True)
        out, at = [], 0
        for group in groups(live):
            n = len(group.members)
            out.append(self.model(tokens[at : at + n, None], cache=group.cache)[:, -1, :])
            at += n
        return mx.concatenate(out) if len(out) > 1 else out[0]

    def _decide(self, members: list[LiveRow], tokens, chosen, alts, skip=frozenset()) -> list[LiveRow]:
        """Which rows go on after these tokens (decode.decode's rules), their hand-over queued for
        `_deliver`: the next step's forward can start before the clients hear of this one."""
        keep = []
        for p, m in enumerate(members):
            if id(m.job) in skip or m.job.gone(m.index):
                continue
            row, token = m.row, tokens[p]
            if row.error is not None:
                self._fail(m.job, 500, f"constrained decoding failed: {row.error}")
                continue
            reason = None
            if token in row.stop_ids:
                reason = "stop"
            else:
                row.generated += 1
                self.tokens += 1
                if row.spec.mask is not None and row.spec.mask.should_stop(token):
                    reason = "stop"
                elif row.generated >= row.spec.max_tokens:
                    reason = "length"
            self._undelivered.append((m, token, chosen[p], alts[p] if alts else None, reason))
            if reason is None:
                m.token = token
                keep.append(m)
        if not self.per_row:
            shrink_groups(members, keep)
        return keep

    def _deliver(self) -> None:
        """Hand the decided tokens to their jobs: text, log-probability and alternatives, then for a
        row that ended its last piece and reason (and a constrained row's JSON)."""
        queued, self._undelivered = self._undelivered, []
        for m, token, chosen, alts, reason in queued:
            if m.job.cancelled:
                continue
            row = m.row
            if token not in row.stop_ids:
                row.detok.add_token(token)
                segment = row.detok.last_segment  # reading it takes it: once
                m.text.append(segment)
                m.tokens.append(token)
                k = m.job.top_logprobs
                alternatives = top_alternatives(self.tokenizer, alts)[:k] if k and alts is not None else []
                m.job.tell("step", m.index, _step(token, segment, chosen, alternatives))
            if reason is None:
                continue
            row.detok.finalize()
            stop = token if token in row.stop_ids else None
            final = _step(None, row.detok.last_segment, 0.0, [], reason, stop)
            m.job.tell("step", m.index, final)
            if row.spec.mask is not None:
                m.text.append(final.text)
                try:
                    checked = finish(row.spec.mask, "".join(m.text), m.tokens, reason)
                except Exception as e:  # noqa: BLE001 - the grammar accepted non-JSON: a bug, this row only
                    self._fail(m.job, 500, f"constrained decoding failed: {e}")
                    continue
                m.job.tell("json", m.index, checked)

    def _drop_cancelled(self) -> None:
        if any(m.job.gone(m.index) for m in self._live):
            keep = [m for m in self._live if not m.job.gone(m.index)]
            if not self.per_row:
                shrink_groups(self._live, keep)
            self._live = keep

    def _fail(self, job: Job, status: int, message: str) -> None:
        if not job.cancelled:
            job.cancelled = True  # its other rows leave too
            job.tell("error", None, (status, message))


def _stop_if_left(job: Job) -> None:
    if job.cancelled:
        raise _Left


def _settle(model) -> None:
    """Evaluate every array the model holds, here, on the thread that built it: MLX cannot evaluate on
    one thread a lazy array made on another ("There is no Stream(cpu, 0) in current thread"), and a
    module may keep one outside its parameters (model.RoPE's llama3 frequencies, `_freqs`)."""
    held = [v for _, m in model.named_modules() for v in m.values() if isinstance(v, mx.array)]
    mx.eval(model.parameters(), held)


# A thread that ran MLX's compiled functions (nn.silu, our swiglu) and then exits makes the process
# abort at exit ("terminate called without an active exception", MLX 0.32.4). So engine threads never
# exit: a closed Batcher's thread parks and serves the next Batcher (tests make several apps).
_IDLE: "queue.SimpleQueue[queue.SimpleQueue]" = queue.SimpleQueue()


def _on_engine_thread(fn: Callable[[], None]) -> None:
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


def _step(token, text, logprob, alternatives, finish_reason=None, stop_token=None) -> Step:
    return Step(token, text, logprob, alternatives, finish_reason=finish_reason, stop_token=stop_token)
