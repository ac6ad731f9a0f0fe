"""The loop: prefill the prompt once, then decode B rows per pass (B = 1 is plain generate).

Every row continues the same prompt with its own sampler state: its seed's key chain, its
penalty history, its grammar mask, its stop rule and token budget. A seed's key chain is
what MLX's global stream is after `mx.random.seed(seed)` (see sampler.py), so a row draws
what mlx-lm draws for that seed alone, whatever else shares the batch, as long as the
forward pass gives each row the same bits alone or in a batch (MLX's CPU quantized matmul
does; a BLAS sgemm over B rows and sgemv over one differ in the last bits). Rows that finish
leave the batch, so they stop costing passes.

The order of work follows mlx-lm's `generate_step` so that seeded draws are token-for-token
identical: the prompt except its last token is prefilled in chunks, the last token runs
alone, and each step is queued one ahead (the next pass is built before the current tokens
reach the host). A model on the float32 path has no mlx-lm twin to match, so there the last
prompt token rides in the prefill's final chunk and only its position goes through the output
table: one pass over the weights fewer before the first token.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import mlx.core as mx
import numpy as np

from .. import keychain
from ..cpu import kernels
from ..errors import MlxinferError
from ..model.cache import fork, keep_rows
from ..model.finite import check_scores
from ..sampler import BATCH_DRAW_ROWS, cut_tail, draw_rows, make_logits_processors
from ..settings import SamplerSettings
from ..views import Alternative, Stats, Step


@dataclass
class RowSpec:
    """One continuation of the prompt: how it samples and when it stops."""

    seed: Optional[int] = None  # None: MLX's global random stream (seed it with mx.random.seed)
    settings: SamplerSettings = field(default_factory=SamplerSettings)
    max_tokens: int = 256
    mask: Any = None  # a constrain.GrammarMask for this row, or None


@dataclass
class Prefilled:
    """The prompt in a one-row KV cache, and the scores (1, V) for the first new token."""

    ids: list[int]
    cache: list
    logits: mx.array


def check_context(model, n_prompt: int, extra: int = 0) -> None:
    limit = model.config.max_position_embeddings
    if n_prompt == 0:
        raise MlxinferError("prompt is empty; give some text", "prompt")
    if n_prompt > limit:
        raise MlxinferError(
            f"the prompt is {n_prompt:,} tokens but the model's context is {limit:,}; shorten the prompt", "prompt"
        )
    if n_prompt + extra > limit:
        raise MlxinferError(
            f"the prompt is {n_prompt:,} tokens and the model's context is {limit:,}: lower "
            f"max_tokens to at most {limit - n_prompt:,} (got {extra:,})",
            "max_tokens",
        )


def prefill(
    model, ids: list[int], step_size: int = 2048, progress: Optional[Callable[[int, int], None]] = None
) -> Prefilled:
    """Run the prompt through the model in chunks of `step_size`, filling a new one-row cache."""
    cache = model.make_cache()
    last_in_chunk = model.info.compute_dtype in ("float32", "quantized", "int8") and hasattr(model, "run_layers")
    head = ids if last_in_chunk else ids[:-1]
    logits, done = None, 0
    while done < len(head):
        chunk = head[done : done + step_size]
        done += len(chunk)
        if last_in_chunk and done == len(head):
            h = model.run_layers(model.embed(mx.array(chunk)[None]), cache)  # (1, L, D)
            logits = model.logits_from_hidden(h[:, -1:, :])[:, -1, :]  # (1, V): the last position only
            mx.eval(logits, [c.state for c in cache])
        else:
            model(mx.array(chunk)[None], cache=cache)
            mx.eval([c.state for c in cache])
        if progress:
            progress(done, len(head))
    if logits is None:  # the last prompt token runs alone, as in mlx-lm's generate_step
        logits = model(mx.array(ids[-1:])[None], cache=cache)[:, -1, :]
        mx.eval(logits)
    check_scores(model, ids, logits)
    return Prefilled(list(ids), cache, logits)


class RowState:
    """A row's sampler state through the loop."""

    def __init__(self, spec: RowSpec, history: mx.array, tokenizer, stop_ids: set[int]):
        self.spec = spec
        self.processors = make_logits_processors(spec.settings) + ([spec.mask] if spec.mask is not None else [])
        self.key = None if spec.seed is None else np.array(mx.random.key(spec.seed))  # (2,) uint32
        self.history = history  # every token fed so far: what penalties and the mask read
        self.detok = copy.copy(tokenizer.detokenizer)  # a streaming detokenizer of its own
        self.detok.reset()
        self.stop_ids = stop_ids | (spec.mask.stop_ids if spec.mask is not None else set())
        self.generated = 0

    def scores(self, logits: mx.array, fed: mx.array, fast: bool = False) -> mx.array:
        """Log-probabilities (1, V) from the scores (1, V) that followed the token `fed`, after this
        row's penalties and mask. fast: the CPU paths' own log-softmax (their scores are not mlx-lm's
        bits anyway); else generate_step's expression, the same bits as mlx-lm."""
        if self.processors:
            self.history = mx.concatenate([self.history, fed.astype(mx.int32)])
            for process in self.processors:
                logits = process(self.history, logits)
        return kernels.log_softmax(logits) if fast else logits - mx.logsumexp(logits, keepdims=True)


def _next_keys(rows: list[RowState]) -> list:
    """Each row's key for this draw (None: the global stream): every seeded chain split once,
    as MLX's global stream would be, all rows in one numpy call (keychain.py)."""
    seeded = [i for i, row in enumerate(rows) if row.key is not None]
    keys = [None] * len(rows)
    if seeded:
        chains, subkeys = keychain.split(np.stack([rows[i].key for i in seeded]))
        for j, i in enumerate(seeded):
            rows[i].key, keys[i] = chains[j], subkeys[j]
    return keys


def _kept(logprobs: mx.array, settings) -> mx.array:
    """cut_tail's row, or the row itself when greedy: the draw is then its argmax, the one token
    cut_tail would keep (four ops over the vocabulary fewer a step)."""
    return logprobs if settings.greedy else cut_tail(logprobs, settings)


def _stacked(rows: list[mx.array]) -> mx.array:
    return rows[0] if len(rows) == 1 else mx.concatenate(rows)  # one row: no copy of its V scores


def choose_tokens(
    rows: list[RowState],
    logits: mx.array,
    fed: list[mx.array],
    n_alternatives: int,
    fast: bool,
    step_logprobs: bool,
    host_draw: bool = False,
):
    """One draw per row: tokens (A,), their log-probabilities (A,), and the best alternatives.

    Rows that share their settings and have nothing to adjust (no penalties, no mask) are
    normalised and cut in one op over (A, V): the same bits per row as one row at a time
    (checked by the tests), fewer dispatches. Each row draws with its own key; on a CPU all seeded
    rows are drawn in one call (sampler.draw_rows), the tokens mx.random.categorical gives each.
    On the float32 CPU path (`fast`), when no one reads the tokens' logprobs (an experiment's rows),
    the normalisation is skipped: a draw does not depend on a shift of its row, and MLX's CPU exp
    over 49k scores a row was a sixth of a 64-row step. The draw's bits then differ from mlx-lm's in
    the last place, as the float32 path's scores already do.
    host_draw: the caller reads each step's tokens on the host before the next (the server's
    engine), so the native draw serves from one seeded row on: it has no lazy draw to lose.
    """
    settings = rows[0].spec.settings
    if (
        len(rows) > 1
        and all(not r.processors and r.key is not None for r in rows)
        and all(r.spec.settings == settings for r in rows)
    ):
        if fast and not step_logprobs and not settings.cuts_tail:
            logprobs = logits
        elif fast:
            logprobs = kernels.log_softmax(logits)
        else:
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # (A, V), or (1, V) shared
        logprobs = mx.broadcast_to(logprobs, (len(rows), logprobs.shape[-1]))
        kept = _kept(logprobs, settings)
    else:
        rows_logprobs = [
            row.scores(logits if logits.shape[0] == 1 else logits[i : i + 1], fed[i], fast)
            for i, row in enumerate(rows)
        ]
        kept = _stacked([_kept(lp, row.spec.settings) for lp, row in zip(rows_logprobs, rows)])
        logprobs = _stacked(rows_logprobs)
    temperatures, keys = [row.spec.settings.temperature for row in rows], _next_keys(rows)
    y = draw_rows(kept, temperatures, keys, min_rows=1 if host_draw else BATCH_DRAW_ROWS)
    if not step_logprobs:
        return y, mx.zeros(y.shape), []
    chosen = mx.take_along_axis(logprobs, y[:, None], axis=-1)[:, 0]  # (A,)
    alternatives = []
    if n_alternatives:
        top = mx.argpartition(-logprobs, kth=n_alternatives - 1, axis=-1)[:, :n_alternatives]  # (A, K)
        alternatives = [(top[i], mx.take_along_axis(logprobs[i], top[i], axis=-1)) for i in range(len(rows))]
    return y, chosen, alternatives


def decode(
    model, tokenizer, prefilled: Prefilled, specs: list[RowSpec], *, logprobs: int = 0, step_logprobs: bool = True
) -> Iterator[tuple[int, Step]]:
    """Yield (row index, Step) as tokens arrive; every row ends with a Step whose token is None and
    whose finish_reason is set ("stop": an end-of-turn token or a finished grammar; "length").
    step_logprobs=False: the Steps' logprob is 0.0 (experiments read only the tokens), which lets the
    float32 CPU path skip the normalisation (see choose_tokens)."""
    fast = model.info.cpu_kernels
    history = mx.array(prefilled.ids[:-1], dtype=mx.int32)
    stop_ids = set(tokenizer.eos_token_ids)
    rows = [RowState(spec, history, tokenizer, stop_ids) for spec in specs]
    cache = fork(prefilled.cache, len(rows))
    active = list(range(len(rows)))  # row index at each batch position
    last = mx.array(prefilled.ids[-1:], dtype=mx.int32)
    y, lp, alts = choose_tokens(rows, prefilled.logits, [last] * len(rows), logprobs, fast, step_logprobs)
    mx.async_eval(y, lp, alts)
    while active:
        queued = None
        if any(rows[i].generated + 1 < rows[i].spec.max_tokens for i in active):
            logits = model(y[:, None], cache=cache)[:, -1, :]  # (A, V)
            queued = choose_tokens(
                [rows[i] for i in active],
                logits,
                [y[p : p + 1] for p in range(len(active))],
                logprobs,
                fast,
                step_logprobs,
            )
            mx.async_eval(*queued)
        tokens, chosen = y.tolist(), lp.tolist()
        keep = []
        for p, i in enumerate(active):
            row, token = rows[i], tokens[p]
            reason = None
            if token in row.stop_ids:
                reason = "stop"
            else:
                row.generated += 1
                row.detok.add_token(token)
                alternatives = top_alternatives(tokenizer, alts[p]) if logprobs else []
                yield i, Step(token, row.detok.last_segment, chosen[p], alternatives)
                if row.spec.mask is not None and row.spec.mask.should_stop(token):
                    reason = "stop"
                elif row.generated >= row.spec.max_tokens:
                    reason = "length"
            if reason is None:
                keep.append(p)
                continue
            row.detok.finalize()
            stop = token if token in row.stop_ids else None
            yield i, Step(None, row.detok.last_segment, 0.0, finish_reason=reason, stop_token=stop)
        if queued is None or not keep:
            break
        y, lp, alts = queued
        if len(keep) < len(active):  # finished rows leave the batch
            index = mx.array(keep, dtype=mx.int32)
            cache = keep_rows(cache, keep)
            y, lp, alts = y[index], lp[index], [alts[p] for p in keep] if alts else alts
        active = [active[p] for p in keep]


def top_alternatives(tokenizer, top) -> list[Alternative]:
    ids, values = top[0].tolist(), top[1].tolist()
    best = sorted(zip(values, ids), reverse=True)
    return [Alternative(t, tokenizer.decode([t]), v) for v, t in best]


def prefill_and_decode(
    model,
    tokenizer,
    ids: list[int],
    specs: list[RowSpec],
    *,
    batch_size: Optional[int] = None,
    logprobs: int = 0,
    step_logprobs: bool = True,
    stats: Optional[Stats] = None,
) -> Iterator[tuple[int, Step]]:
    """Prefill `ids` once, then decode the rows `batch_size` at a time (all at once by default),
    each group continuing the same prefilled cache. Fills `stats` as it goes: time to the first
    token (the prefill and the first draw), decode speed over the rest, peak memory."""
    stats = stats if stats is not None else Stats()
    check_context(model, len(ids), max(spec.max_tokens for spec in specs))
    size = batch_size or len(specs)
    stats.prompt_tokens = len(ids)
    mx.reset_peak_memory()
    start = time.perf_counter()
    shared = prefill(model, ids)
    first, first_tokens = None, 0
    for g in range(0, len(specs), size):
        for i, step in decode(
            model, tokenizer, shared, specs[g : g + size], logprobs=logprobs, step_logprobs=step_logprobs
        ):
            if first is None:
                first = time.perf_counter()
                stats.prefill_seconds = first - start
                stats.prefill_tokens_per_s = len(ids) / max(stats.prefill_seconds, 1e-9)
                first_tokens = min(size, len(specs))  # the first pass's tokens came with the prefill
            if step.token is not None:
                stats.generated_tokens += 1
            else:
                stats.finish_reason = step.finish_reason
            yield g + i, step
    stats.decode_seconds = time.perf_counter() - first
    stats.decode_tokens_per_s = max(stats.generated_tokens - first_tokens, 0) / max(stats.decode_seconds, 1e-9)
    stats.peak_memory_bytes = mx.get_peak_memory()
