"""Prefill the prompt once, then decode B rows per pass (B = 1 is plain generate): the driver of the
row core (core.py) for generate, stream_generate, sample and sweep.

Every row continues the same prompt with its own sampler state (sampler/row.py): its seed's key
chain, its penalty history, its grammar mask; and its own stop rules and token budget (core.py).
A row draws what mlx-lm draws for that seed alone, whatever else shares the batch, as long as the
forward pass gives each row the same bits alone or in a batch (MLX's CPU quantized matmul does; a
BLAS sgemm over B rows and sgemv over one differ in the last bits). Rows that finish leave the
batch, so they stop costing passes.

The order of work follows mlx-lm's `generate_step` so that seeded draws are token-for-token
identical: the prompt except its last token is prefilled in chunks, the last token runs
alone, and each step is queued one ahead (the next pass is built before the current tokens
reach the host). A model on the float32 path has no mlx-lm twin to match, so there the last
prompt token rides in the prefill's final chunk and only its position goes through the output
table: one pass over the weights fewer before the first token.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import mlx.core as mx

from .. import defaults
from ..errors import MlxinferError, check_whole, is_whole
from ..model.finite import check_scores
from ..views import Stats, Step
from .core import Batch, Row, RowSpec, alternatives_of


@dataclass
class Prefilled:
    """The prompt in a one-row KV cache, and the scores (1, V) for the first new token."""

    ids: list[int]
    cache: list
    logits: mx.array


def check_progress(progress) -> None:
    if progress is not None and not callable(progress):
        raise MlxinferError(f"progress must be a function or None, got {type(progress).__name__}", "progress")


def check_ids(model, ids) -> list[int]:
    """Token ids a model can read: a non-empty list of whole numbers below its vocabulary size, within
    its context (an id past the table would read an embedding row that is not there)."""
    vocab = model.config.vocab_size
    if type(ids).__module__ in ("numpy", "mlx.core") and getattr(ids, "ndim", None) == 1:
        ids = ids.tolist()  # ids already encoded, held in an array
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)):
        raise MlxinferError(f"ids must be a list of token ids, got {type(ids).__name__}; encode text first", "ids")
    bad = [t for t in ids if not is_whole(t) or not 0 <= t < vocab]
    if bad:
        raise MlxinferError(f"token ids must be whole numbers in 0..{vocab - 1:,}, got {bad[0]!r}", "ids")
    check_context(model, len(ids))
    return list(ids)


def check_context(model, n_prompt: int, extra: int = 0) -> None:
    limit = model.config.max_position_embeddings
    if n_prompt == 0:
        raise MlxinferError("prompt is empty; give some text", "prompt")
    if n_prompt > limit:
        raise MlxinferError(
            f"the prompt is {n_prompt:,} tokens but the model's context is {limit:,}; shorten the prompt", "prompt"
        )
    if n_prompt == limit and extra:  # no room for even one new token
        raise MlxinferError(
            f"the prompt is {n_prompt:,} tokens and the model's context is {limit:,}, leaving no room for a new "
            f"token; shorten the prompt to at most {limit - 1:,} tokens",
            "prompt",
        )
    if n_prompt + extra > limit:
        raise MlxinferError(
            f"the prompt is {n_prompt:,} tokens and the model's context is {limit:,}: lower "
            f"max_tokens to at most {limit - n_prompt:,} (got {extra:,})",
            "max_tokens",
        )


SCORE_COPIES = 4  # (rows, vocabulary) float32 arrays a pass holds at once: the scores, the sampler's and the draw's


def check_pass_fits(model, rows: int, param: str = "batch_size") -> None:
    """A pass of `rows` rows must fit this machine's memory with its scores over the vocabulary (past it MLX's
    allocation ends the process with a segmentation fault, numpy's with a traceback). The keys and values are not
    counted: they grow with each row's length, and most rows end long before max_tokens."""
    from ..model.dtype_rule import physical_ram_bytes

    vocab, ram = model.config.vocab_size, physical_ram_bytes()
    per_row = SCORE_COPIES * 4 * vocab
    if ram is not None and rows * per_row > ram:
        raise MlxinferError(
            f"a pass of {rows:,} rows would need about {rows * per_row / 1e9:,.1f} GB for its scores alone "
            f"({per_row / 1e6:,.1f} MB a row over {vocab:,} tokens) and this machine has {ram / 1e9:,.1f} GB: at "
            f"most {max(1, ram // per_row):,} rows fit; lower {param}",
            param,
        )


_others = threading.local()  # .turn: what others_between_chunks set on this thread


@contextmanager
def others_between_chunks(turn: Callable[[], None], step_size: int):
    """Within the block, on this thread, every prefill runs in chunks of `step_size` (unless it asks for
    its own) and calls `turn` between two of them: how the server's engine steps its rows in flight while
    a function it runs (the explorer's table, an answers walk) prefills a long prompt. A prefill that
    `turn` itself starts is not interrupted again."""

    def once() -> None:
        _others.turn = None
        try:
            turn()
        finally:
            _others.turn = once

    _others.turn, _others.step_size = once, step_size
    try:
        yield
    finally:
        _others.turn = None


def prefill(
    model, ids: list[int], step_size: Optional[int] = None, progress: Optional[Callable[[int, int], None]] = None
) -> Prefilled:
    """Run the prompt through the model in chunks of `step_size`, filling a new one-row cache. By
    default the chunk is mlx-lm's 2048 tokens, and 512 on the native kernels' paths, whose scores do not
    depend on the chunk: a chunk is one uninterrupted evaluation, so Ctrl-C is heard between two."""
    ids = check_ids(model, ids)
    last_in_chunk = model.info.compute_dtype in ("float32", "quantized", "int8") and hasattr(model, "run_layers")
    if step_size is None and getattr(_others, "turn", None) is not None:
        step_size = _others.step_size
    if step_size is None:
        invariant = last_in_chunk and model.info.compute_dtype != "float32"  # the native kernels' paths
        step_size = defaults.PREFILL_CHUNK_CPU if invariant else defaults.PREFILL_CHUNK
    check_whole(step_size, "step_size", 1, "a whole number, at least 1")
    check_progress(progress)
    cache = model.make_cache()
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
        turn = getattr(_others, "turn", None)
        if turn is not None and done < len(head):
            turn()
    if logits is None:  # the last prompt token runs alone, as in mlx-lm's generate_step
        logits = model(mx.array(ids[-1:])[None], cache=cache)[:, -1, :]
        mx.eval(logits)
    check_scores(model, ids, logits)
    return Prefilled(list(ids), cache, logits)


def decode(
    model,
    tokenizer,
    prefilled: Prefilled,
    specs: list[RowSpec],
    *,
    logprobs: int = 0,
    step_logprobs: bool = True,
    keep_steps: bool = False,
    first_index: int = 0,
) -> Iterator[tuple[Row, Step]]:
    """Yield (row, Step) as tokens arrive (row.index: its spec's place, plus first_index); every row
    ends with a Step whose token is None and whose finish_reason is set (core.py's rules), and then
    row.result holds its whole text and tokens (and its Steps, with keep_steps).
    step_logprobs=False: the Steps' logprob is 0.0 (experiments read only the tokens), which lets the
    float32 CPU path skip the normalisation (sampler/row.py's draw_batch)."""
    batch = Batch(model, tokenizer, keep_steps=keep_steps)
    rows = batch.admit(prefilled, specs, first_index)
    last = mx.array(prefilled.ids[-1:], dtype=mx.int32)
    drawn = batch.draw(rows, prefilled.logits, [last] * len(rows), logprobs, step_logprobs)
    mx.async_eval(*drawn.arrays())
    try:
        while rows:
            queued = None
            if any(row.may_continue() for row in rows):  # the next pass is queued before these tokens are read
                logits = batch.forward(rows, drawn.tokens)  # (A, V)
                queued = batch.draw(rows, logits, drawn.tokens, logprobs, step_logprobs)
                mx.async_eval(*queued.arrays())
            tokens, chosen = drawn.tokens.tolist(), drawn.logprobs.tolist()
            finite = drawn.finite.tolist() if drawn.finite is not None else [True] * len(rows)
            keep = []
            for p, row in enumerate(rows):
                reason = row.decide(tokens[p], finite[p])
                if reason == "error":
                    raise row.sampler.error or MlxinferError(f"{row.error}; the run was ended", "source")
                alternatives = alternatives_of(tokenizer, drawn.alternatives[p]) if logprobs else []
                for step in row.take(tokens[p], chosen[p], alternatives, reason):
                    yield row, step
                if not row.ended:
                    keep.append(p)
            if queued is None or not keep:
                break
            if len(keep) < len(rows):  # finished rows leave the batch
                queued = queued.keep(keep)
                batch.keep(rows, [rows[p] for p in keep])
            drawn, rows = queued, [rows[p] for p in keep]
    finally:  # ended, or the caller stopped reading: every row lets go of its cache
        batch.keep(rows, [])


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
    keep_steps: bool = False,
) -> Iterator[tuple[Row, Step]]:
    """Prefill `ids` once, then decode the rows `batch_size` at a time (all at once by default),
    each group continuing the same prefilled cache. Fills `stats` as it goes: time to the first
    token (the prefill and the first draw), decode speed over the rest, peak memory."""
    stats = stats if stats is not None else Stats()
    check_context(model, len(ids), max(spec.max_tokens for spec in specs))
    size = batch_size or len(specs)
    check_pass_fits(model, min(size, len(specs)))
    stats.prompt_tokens = len(ids)
    mx.reset_peak_memory()
    start = time.perf_counter()
    shared = prefill(model, ids)
    first, first_tokens = None, 0
    try:
        for g in range(0, len(specs), size):
            part = specs[g : g + size]
            options = dict(logprobs=logprobs, step_logprobs=step_logprobs, keep_steps=keep_steps, first_index=g)
            for row, step in decode(model, tokenizer, shared, part, **options):
                if first is None:
                    first = time.perf_counter()
                    stats.prefill_seconds = first - start
                    stats.prefill_tokens_per_s = len(ids) / max(stats.prefill_seconds, 1e-9)
                    first_tokens = min(size, len(specs))  # the first pass's tokens came with the prefill
                if step.token is not None:
                    stats.generated_tokens += 1
                else:
                    stats.finish_reason = step.finish_reason
                yield row, step
    finally:  # at the end, or closed part-way (a stream stopped by Ctrl-C): its speed so far
        if first is not None:
            stats.decode_seconds = time.perf_counter() - first
            stats.decode_tokens_per_s = max(stats.generated_tokens - first_tokens, 0) / max(stats.decode_seconds, 1e-9)
        stats.peak_memory_bytes = mx.get_peak_memory()
