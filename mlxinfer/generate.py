"""The loop: prefill the prompt into the KV cache, then decode one token per pass.

`token_stream` is the bare loop (token ids and log-probabilities); `generate`
wraps it with text streaming, stop rules, logprobs and the stats a user wants.
The order of work follows mlx-lm's `generate_step` so that seeded draws are
token-for-token identical: the prompt except its last token is prefilled in
chunks, the last token runs alone, and each step is queued one ahead. A model on
the float32 path (compute.to_float32) has no mlx-lm twin to match, so there the
last prompt token rides in the prefill's final chunk and only its position goes
through the output table: one pass over the weights fewer before the first token.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Optional

import mlx.core as mx

from .cache import KVCache
from .errors import MlxinferError
from .sampler import top_logprobs
from .tables import check_context

# (tokens so far (N,), logits (1, V)) -> logits: penalties, biases, a grammar mask
LogitsProcessor = Callable[[mx.array, mx.array], mx.array]
# log-probabilities (1, V) -> token (1,)
SampleFn = Callable[[mx.array], mx.array]


def greedy(logprobs: mx.array) -> mx.array:
    return mx.argmax(logprobs, axis=-1)


def prefill(model, ids: list[int], cache: list[KVCache], step_size: int = 2048,
            progress: Optional[Callable[[int, int], None]] = None, last_logits: bool = False) -> Optional[mx.array]:
    """Run `ids` through the model in chunks, filling the cache.

    Their scores are not needed, except with last_logits: then the (1, V) logits of the
    last position are returned (computed for that position only).
    """
    done, total, logits = 0, len(ids), None
    while done < total:
        chunk = ids[done : done + step_size]
        h = model.run_layers(model.embed_tokens(mx.array(chunk)[None]), cache)  # (1, L, D)
        done += len(chunk)
        if last_logits and done == total:
            logits = model.logits_from_hidden(h[:, -1:, :])[:, -1, :]  # (1, V)
            mx.eval(logits, [c.state for c in cache])
        else:
            mx.eval([c.state for c in cache])
        if progress:
            progress(done, total)
    return logits


def token_stream(
    model,
    prompt_ids: list[int],
    sample: SampleFn = greedy,
    *,
    max_tokens: int = 256,
    processors: Optional[list[LogitsProcessor]] = None,
    cache: Optional[list[KVCache]] = None,
    prefill_step_size: int = 2048,
    progress: Optional[Callable[[int, int], None]] = None,
) -> Iterator[tuple[int, mx.array]]:
    """Yield (token, logprobs (V,)) for up to max_tokens new tokens.

    With `cache` already holding the prompt's first len(prompt_ids) - 1 positions
    (see `prefill`), only the last prompt token is run: reuse one prefill for many seeds.
    """
    cache = cache if cache is not None else model.make_cache()
    history = mx.array(prompt_ids[:-1], dtype=mx.int32)  # what processors see: every token fed so far
    last = mx.array(prompt_ids[-1:])
    first_logits = None
    if cache[0].offset == 0:
        if getattr(model, "compute_dtype", None) == "float32":  # see the module docstring
            first_logits = prefill(model, prompt_ids, cache, prefill_step_size, progress, last_logits=True)
        else:
            prefill(model, prompt_ids[:-1], cache, prefill_step_size, progress)
    elif cache[0].offset != len(prompt_ids) - 1:
        raise ValueError("the cache must hold the prompt except its last token")

    def choose(tokens: mx.array, logits: mx.array) -> tuple[mx.array, mx.array]:
        """(token (1,), logprobs (V,)) from the logits (1, V) that followed `tokens`."""
        nonlocal history
        if processors:
            history = mx.concatenate([history, tokens.astype(mx.int32)])
            for process in processors:
                logits = process(history, logits)
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        return sample(logprobs), logprobs.squeeze(0)

    def step(tokens: mx.array) -> tuple[mx.array, mx.array]:
        return choose(tokens, model(tokens[None], cache)[:, -1, :])  # (1, V)

    y, logprobs = step(last) if first_logits is None else choose(last, first_logits)
    mx.async_eval(y, logprobs)
    for n in range(max_tokens):
        if n + 1 < max_tokens:
            next_y, next_logprobs = step(y)  # queued before this token reaches the host, as mlx-lm does
            mx.async_eval(next_y, next_logprobs)
        yield y.item(), logprobs
        if n + 1 < max_tokens:
            y, logprobs = next_y, next_logprobs


@dataclass
class Step:
    token: int
    text: str  # the new text this token completes (may be empty while a character is split)
    logprob: float
    alternatives: list[dict] = field(default_factory=list)  # the K best: id, text, logprob


@dataclass
class Stats:
    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    prefill_tokens_per_s: float = 0.0
    generated_tokens: int = 0
    decode_seconds: float = 0.0
    decode_tokens_per_s: float = 0.0
    peak_memory_bytes: int = 0
    finish_reason: str = ""  # "stop" (end-of-turn token) or "length" (max tokens)


@dataclass
class Generation:
    text: str
    tokens: list[int]
    steps: list[Step]
    stats: Stats
    settings: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def generate_steps(
    model,
    tokenizer,
    prompt_ids: list[int],
    sample: SampleFn = greedy,
    *,
    max_tokens: int = 256,
    processors: Optional[list[LogitsProcessor]] = None,
    logprobs: int = 0,
    stats: Optional[Stats] = None,
    stop_ids: Optional[set[int]] = None,
    cache: Optional[list[KVCache]] = None,
    should_stop: Optional[Callable[[int], bool]] = None,
) -> Iterator[Step]:
    """Stream Steps; fill `stats` as it goes (finish reason, speeds, peak memory).

    `should_stop(token)` is asked after each token is yielded, in order; True ends the run
    with finish reason "stop" (a grammar mask's `should_stop`: the JSON is complete, so no
    pass is spent on drawing the end-of-turn token).
    Bad input is reported here, before the first step is asked for.
    """
    if max_tokens < 1:
        raise MlxinferError(f"--max-tokens must be at least 1, got {max_tokens}")
    check_context(model, len(prompt_ids), extra=max_tokens)
    stats = stats if stats is not None else Stats()
    stats.prompt_tokens = len(prompt_ids)
    stop_ids = set(tokenizer.eos_token_ids) if stop_ids is None else stop_ids
    stream = token_stream(model, prompt_ids, sample, max_tokens=max_tokens, processors=processors, cache=cache)
    return _steps(stream, tokenizer, len(prompt_ids), logprobs, stats, stop_ids, should_stop)


def _steps(stream, tokenizer, n_prompt: int, logprobs: int, stats: Stats, stop_ids: set[int],
           should_stop: Optional[Callable[[int], bool]] = None) -> Iterator[Step]:
    detok = tokenizer.detokenizer
    detok.reset()
    mx.reset_peak_memory()
    start = time.perf_counter()
    first_token_at = None
    stats.finish_reason = "length"
    for n, (token, lp) in enumerate(stream):
        if first_token_at is None:
            first_token_at = time.perf_counter()
            stats.prefill_seconds = first_token_at - start
            stats.prefill_tokens_per_s = n_prompt / max(stats.prefill_seconds, 1e-9)
        if token in stop_ids:
            stats.finish_reason = "stop"
            break
        detok.add_token(token)
        stats.generated_tokens = n + 1
        yield Step(token, detok.last_segment, lp[token].item(), _alternatives(tokenizer, lp, logprobs))
        if should_stop is not None and should_stop(token):
            stats.finish_reason = "stop"
            break
    detok.finalize()
    tail = detok.last_segment
    if tail:
        yield Step(-1, tail, 0.0)  # text held back at the end (a split character or a trailing space)
    end = time.perf_counter()
    if first_token_at is not None:
        stats.decode_seconds = end - first_token_at
        # the first token came with the prefill; the rest are decode passes
        stats.decode_tokens_per_s = max(stats.generated_tokens - 1, 0) / max(stats.decode_seconds, 1e-9)
    stats.peak_memory_bytes = mx.get_peak_memory()


def _alternatives(tokenizer, logprobs: mx.array, k: int) -> list[dict]:
    if k <= 0:
        return []
    return [{"id": t, "text": tokenizer.decode([t]), "logprob": v} for t, v in top_logprobs(logprobs, k)]


def collect(steps: Iterator[Step], stats: Stats, settings: Optional[dict] = None) -> Generation:
    kept = [s for s in steps]
    tokens = [s.token for s in kept if s.token >= 0]
    return Generation("".join(s.text for s in kept), tokens, [s for s in kept if s.token >= 0], stats, settings or {})
