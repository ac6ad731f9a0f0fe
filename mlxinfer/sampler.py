"""The sampler: the code after the model that turns one row of scores into one token.

The lesson's chain, each stage a small pure function over MLX arrays:

    scores -> adjustments (apply_logit_bias, apply_penalties, apply_mask)
           -> apply_temperature (divide by T) -> softmax / log_softmax
           -> cut the tail (apply_top_k, apply_top_p, apply_min_p) and rescale to 1
           -> draw one token                      temperature 0: argmax instead

The settings (``SamplerSettings``) live in settings.py, without mlx; the tables that show
what the chain does (the next-token table, ``explain``) in engine/tables.py.

Two orders of the last steps (``SamplerSettings.order``):

* ``"temperature-first"`` (default) is the order the lesson describes: divide by the temperature
  first, then cut the tail of the tempered probabilities (as transformers and vLLM do).
* ``"mlx-lm"`` reproduces ``mlx_lm.sample_utils.make_sampler``: it cuts the tail of the
  *untempered* log-probabilities (top-p, then min-p, then top-k) and applies the
  temperature only in the draw, ``mx.random.categorical(logprobs * (1 / T))``.

Top-k keeps the same tokens in either order; top-p and min-p do not. With no cut the two
orders are the same computation, and the draw is token-for-token identical to mlx-lm's
under the same ``mx.random.seed``. A draw with an explicit ``key`` equals the global stream's:
after ``mx.random.seed(s)`` the global stream is the key chain ``state = mx.random.key(s)``,
then per draw ``state, sub = mx.random.split(state)``; each row of a batch carries its own
chain (see engine/decode.py), so a seed draws the same tokens whatever shares its batch.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable

import mlx.core as mx
import numpy as np

from . import keychain
from .cpu import draw as cpu_draw
from .errors import MlxinferError
from .settings import SamplerSettings

NEG_INF = -float("inf")


# ----------------------------------------------------------------------------- adjustments
def _tokens(history, vocab_size: int) -> mx.array:
    tokens = history if isinstance(history, mx.array) else mx.array(list(history), dtype=mx.int32)
    tokens = tokens.reshape(-1).astype(mx.int32)
    if tokens.size and (mx.min(tokens).item() < 0 or mx.max(tokens).item() >= vocab_size):
        raise MlxinferError(
            f"history has token ids outside 0..{vocab_size - 1}; pass ids from this model's vocabulary", "history"
        )
    return tokens


def check_logit_bias(bias: dict[int, float] | None, vocab: int) -> None:
    """Every id logit_bias names is below the vocabulary's size."""
    if bias and max(bias) >= vocab:
        raise MlxinferError(
            f"logit_bias names token {max(bias)} but the vocabulary has {vocab}; use ids below that", "logit_bias"
        )


def apply_logit_bias(logits: mx.array, bias: dict[int, float] | None) -> mx.array:
    """Add ``bias[token]`` to that token's score (OpenAI's logit_bias)."""
    if not bias:
        return logits
    check_logit_bias(bias, logits.shape[-1])
    idx = mx.array(list(bias.keys()), dtype=mx.int32)
    return logits.at[..., idx].add(mx.array(list(bias.values()), dtype=logits.dtype))


def apply_penalties(
    logits: mx.array,
    history,
    repetition_penalty: float = 1.0,
    presence_penalty: float = 0.0,
    frequency_penalty: float = 0.0,
) -> mx.array:
    """Penalise tokens already in ``history`` (token ids; a list or an mx.array).

    Repetition penalty as in transformers and mlx-lm (Keskar et al. 2019): the score of
    every seen token is divided by the penalty when positive and multiplied when negative.
    Presence and frequency penalties as OpenAI defines them:
    ``score -= count * frequency_penalty + (count > 0) * presence_penalty``.
    """
    if history is None or (repetition_penalty == 1.0 and not presence_penalty and not frequency_penalty):
        return logits
    tokens = _tokens(history, logits.shape[-1])
    if tokens.size == 0:
        return logits
    counts = mx.zeros((logits.shape[-1],), dtype=mx.float32).at[tokens].add(1.0)
    seen = counts > 0
    out = logits
    if repetition_penalty != 1.0:
        out = mx.where(seen, mx.where(out < 0, out * repetition_penalty, out / repetition_penalty), out)
    if presence_penalty or frequency_penalty:
        out = out - (counts * frequency_penalty + seen * presence_penalty).astype(out.dtype)
    return out


def apply_mask(logits: mx.array, allowed) -> mx.array:
    """Set every token where ``allowed`` (bool, shape (V,); an mx.array or a numpy array) is False to
    -inf: probability exactly 0. The hook for a grammar mask. A mask that allows nothing is an error;
    a numpy mask is checked on the host, an mx.array one costs a sync."""
    if allowed is None:
        return logits
    if allowed.shape[-1] != logits.shape[-1]:
        raise MlxinferError(
            f"mask has {allowed.shape[-1]} entries but the vocabulary has {logits.shape[-1]}", "allowed"
        )
    if not (allowed.any() if isinstance(allowed, np.ndarray) else mx.any(allowed).item()):
        raise MlxinferError("the mask allows no token; the grammar must allow at least one", "allowed")
    return mx.where(mx.array(allowed), logits, mx.array(NEG_INF, logits.dtype))


def adjust(logits: mx.array, settings: SamplerSettings, history=None, allowed=None) -> mx.array:
    """All adjustments in mlx-lm's processor order: bias, penalties, then the mask."""
    s = settings
    out = apply_logit_bias(logits, s.logit_bias)
    if history is not None and s.penalty_window is not None:
        history = history[-s.penalty_window :]
    out = apply_penalties(out, history, s.repetition_penalty, s.presence_penalty, s.frequency_penalty)
    return apply_mask(out, allowed)


# ----------------------------------------------------------------------------- temperature, softmax
def apply_temperature(logits: mx.array, temperature: float) -> mx.array:
    """Divide every score by T, written ``logits * (1 / T)`` exactly as mlx-lm computes it:
    ``logits / T`` can differ in the last float32 bit, and that bit can flip a near-tie draw."""
    if temperature <= 0:
        raise MlxinferError(f"temperature {temperature} cannot divide the scores; 0 means greedy (argmax)")
    return logits * (1.0 / temperature)


def log_softmax(logits: mx.array) -> mx.array:
    """Log-probabilities: ``logits - logsumexp(logits)`` over the vocabulary (last axis)."""
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def softmax(logits: mx.array) -> mx.array:
    return mx.softmax(logits, axis=-1)


def probabilities(logits: mx.array, temperature: float) -> mx.array:
    """softmax(logits / T) over the whole vocabulary; T = 0 puts all of it on the argmax."""
    if temperature == 0:
        return (mx.arange(logits.shape[-1]) == mx.argmax(logits, axis=-1, keepdims=True)).astype(mx.float32)
    return softmax(apply_temperature(logits, temperature))


# ----------------------------------------------------------------------------- cutting the tail
# Each takes log-probabilities (any shift works) and returns them with the cut entries at -inf.
def apply_top_k(logprobs: mx.array, k: int, min_tokens_to_keep: int = 1) -> mx.array:
    """Keep the k highest (at least min_tokens_to_keep); k >= V keeps everything."""
    k = max(k, min_tokens_to_keep)
    if k >= logprobs.shape[-1]:
        return logprobs
    drop = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[..., k:]
    return mx.put_along_axis(logprobs, drop, mx.array(NEG_INF, logprobs.dtype), axis=-1)


def apply_top_p(logprobs: mx.array, p: float, min_tokens_to_keep: int = 1) -> mx.array:
    """Nucleus: keep the smallest set of top tokens whose probabilities add up to at least p.

    A token survives when the mass of the tokens above it is below p (of the row's total
    mass, so a row that was cut before counts as rescaled); mlx-lm's formulation, plus
    min_tokens_to_keep."""
    vocab = logprobs.shape[-1]
    ordered = mx.sort(logprobs, axis=-1)
    probs = mx.exp(ordered.astype(mx.float32))
    mass_above = mx.cumsum(probs, axis=-1, reverse=True, inclusive=False)
    total = mass_above[..., :1] + probs[..., :1]
    n_drop = (mass_above >= p * total).sum(axis=-1, keepdims=True)
    if min_tokens_to_keep > 1:
        n_drop = mx.minimum(n_drop, max(vocab - min_tokens_to_keep, 0))
    threshold = mx.take_along_axis(ordered, n_drop, axis=-1)
    return mx.where(logprobs < threshold, NEG_INF, logprobs)


def apply_min_p(logprobs: mx.array, p: float, min_tokens_to_keep: int = 1) -> mx.array:
    """Keep every token whose probability is at least p times the top token's."""
    remove = logprobs < mx.max(logprobs, axis=-1, keepdims=True) + math.log(p)
    keep = min(min_tokens_to_keep, logprobs.shape[-1])
    if keep > 1:
        top = mx.argpartition(logprobs, kth=-keep, axis=-1)[..., -keep:]
        remove = mx.put_along_axis(remove, top, mx.array(False), axis=-1)
    return mx.where(remove, NEG_INF, logprobs)


def cut_tail(logprobs: mx.array, settings: SamplerSettings) -> mx.array:
    """The untempered log-probabilities with every token the cut removes set to -inf.

    "temperature-first": top-k, top-p, min-p on the *tempered* distribution, each on what the one
    before left (so top-p counts the top-k survivors rescaled to 1); every cut keeps at
    least min_tokens_to_keep. "mlx-lm": mlx-lm's top-p, min-p, top-k on the untempered row.
    Temperature 0 keeps only the argmax.
    """
    s = settings
    if s.greedy:
        top = mx.argmax(logprobs, axis=-1, keepdims=True)
        return mx.where(mx.arange(logprobs.shape[-1]) == top, logprobs, NEG_INF)
    if not s.cuts_tail:
        return logprobs
    if s.order == "mlx-lm":  # mlx-lm's make_sampler: these three, in this order, untempered
        out = apply_top_p(logprobs, s.top_p) if s.top_p < 1.0 else logprobs
        out = apply_min_p(out, s.min_p, s.min_tokens_to_keep) if s.min_p > 0.0 else out
        return apply_top_k(out, s.top_k) if s.top_k > 0 else out
    keep = s.min_tokens_to_keep
    out = log_softmax(apply_temperature(logprobs, s.temperature))
    out = apply_top_k(out, s.top_k, keep) if s.top_k > 0 else out
    out = apply_top_p(out, s.top_p, keep) if s.top_p < 1.0 else out
    out = apply_min_p(out, s.min_p, keep) if s.min_p > 0.0 else out
    return mx.where(out == NEG_INF, NEG_INF, logprobs)


# ----------------------------------------------------------------------------- the draw
@partial(mx.compile, inputs=mx.random.state, outputs=mx.random.state)
def _categorical(logits: mx.array, temperature: float) -> mx.array:
    # the same compiled graph as mlx_lm.sample_utils.categorical_sampling: same bits, same token
    return mx.random.categorical(logits * (1.0 / temperature))


def draw(logprobs: mx.array, temperature: float, key: mx.array | None = None) -> mx.array:
    """One token per row from softmax(logprobs / T), T = 0: the argmax. Cut tokens (-inf) are
    never drawn; the kept ones are rescaled to 1 by the softmax. Without a key the draw comes
    from MLX's global stream (seed it with mx.random.seed), exactly as mlx-lm's does."""
    if temperature == 0:
        return mx.argmax(logprobs, axis=-1)
    if key is None:
        return _categorical(logprobs, temperature)
    return mx.random.categorical(logprobs * (1.0 / temperature), key=key)


# The kernel needs the scores on the host, so the decode loop can no longer build the next
# forward pass while this one runs: below this many rows that costs more than MLX's own draws save
# (docs/performance.md, "Batched draws").
BATCH_DRAW_ROWS = 8


def draw_rows(kept: mx.array, temperatures: list[float], subkeys: list, min_rows: int = BATCH_DRAW_ROWS) -> mx.array:
    """One token per row of cut log-probabilities (A, V): row i is what
    ``draw(kept[i : i + 1], temperatures[i], key)`` gives with ``key = mx.array(subkeys[i])``
    (None: the global stream, drawn in row order). On a CPU, min_rows or more seeded rows are drawn
    in one call to the checked native kernel (cpu/draw.py) instead of one mx.random.categorical per
    row: the same tokens. min_rows=1 for a caller that reads every step's tokens on the host anyway
    (the server's engine: it gains nothing from a lazy draw, and one row's MLX draw is ~1.2 ms)."""
    n = kept.shape[0]
    if n < min_rows or any(k is None for k in subkeys) or not cpu_draw.available():
        keys = [None if k is None else mx.array(k) for k in subkeys]
        tokens = [draw(kept[i : i + 1], temperatures[i], keys[i]) for i in range(n)]
        return tokens[0] if n == 1 else mx.concatenate(tokens)
    greedy = [t == 0 for t in temperatures]
    if all(greedy):
        return mx.argmax(kept, axis=-1)
    if set(temperatures) == {1.0}:
        scaled = kept  # x * 1.0 is x, bit for bit: one pass over (A, V) fewer
    elif len(set(temperatures)) == 1:
        scaled = kept * (1.0 / temperatures[0])  # the scalar in kept's dtype, as in draw()
    else:
        scaled = mx.concatenate([kept[i : i + 1] * (1.0 / (t or 1.0)) for i, t in enumerate(temperatures)])
    uniforms = keychain.uniform(np.stack(subkeys))  # first: it needs no scores, so it runs while the forward does
    tokens = cpu_draw.draw_rows(np.asarray(scaled.astype(mx.float32)), uniforms)
    y = mx.array(tokens).astype(mx.uint32)  # (A,), the dtype mx.random.categorical returns
    return mx.where(mx.array(greedy), mx.argmax(kept, axis=-1), y) if any(greedy) else y


class Sampler:
    """The whole chain for one row of scores, with the settings fixed.

    ``sampler(logits, history=None, allowed=None)`` takes raw scores of shape (V,) or (1, V),
    applies the adjustments, normalises exactly as mlx-lm's generate_step does
    (``logits - mx.logsumexp(logits, keepdims=True)``) and returns a (1,) token array.
    ``sampler.draw(logprobs)`` is the rest of the chain on log-probabilities, the
    contract of mlx-lm's samplers.
    """

    def __init__(self, settings: SamplerSettings | None = None, **options):
        self.settings = (settings if settings is not None else SamplerSettings(**options)).validate()

    def draw(self, logprobs: mx.array, key: mx.array | None = None) -> mx.array:
        row = cut_tail(logprobs, self.settings)
        return draw(row, self.settings.temperature, key)

    def __call__(self, logits: mx.array, history=None, allowed=None, key: mx.array | None = None) -> mx.array:
        if logits.size != logits.shape[-1]:
            raise MlxinferError(f"the sampler takes one row of scores, got shape {tuple(logits.shape)}", "logits")
        row = adjust(logits.reshape(1, -1), self.settings, history, allowed)
        # generate_step's own expression, to the letter (no axis on a (1, V) row): same bits
        return self.draw(row - mx.logsumexp(row, keepdims=True), key)


def make_sampler(settings: SamplerSettings) -> Callable[[mx.array], mx.array]:
    """An mlx-lm-compatible sampler: (1, V) log-probabilities in, (1,) token out.

    Pass it to ``mlx_lm.generate(..., sampler=...)``. It cuts, tempers and draws; the
    adjustments act on raw scores, so give mlx-lm ``make_logits_processors(settings)`` too.
    """
    return Sampler(settings).draw


def make_logits_processors(settings: SamplerSettings) -> list[Callable[[mx.array, mx.array], mx.array]]:
    """The adjustments as mlx-lm logits processors ``(tokens, logits) -> logits``."""
    settings.validate()
    if not settings.adjusts:
        return []
    return [lambda tokens, logits: adjust(logits, settings, tokens)]
