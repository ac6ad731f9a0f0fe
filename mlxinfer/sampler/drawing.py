"""The draw: one token per row of cut log-probabilities, from a seed's key chain or MLX's global stream.

A draw with an explicit ``key`` equals the global stream's: after ``mx.random.seed(s)`` the global
stream is the key chain ``state = mx.random.key(s)``, then per draw ``state, sub = mx.random.split(state)``.
"""

from __future__ import annotations

from functools import partial
from typing import Callable

import mlx.core as mx
import numpy as np

from .. import keychain
from ..cpu import draw as cpu_draw
from ..errors import MlxinferError
from ..settings import SamplerSettings
from .stages import adjust, apply_temperature, cut_tail


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
    if len(set(temperatures)) == 1:  # one temperature (not 0: all-greedy rows returned above)
        scaled = apply_temperature(kept, temperatures[0])  # as in draw(); T = 1 leaves the scores as they are
    else:
        scaled = mx.concatenate([apply_temperature(kept[i : i + 1], t or 1.0) for i, t in enumerate(temperatures)])
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


__all__ = [  # what mlxinfer.sampler exports from here
    "draw",
    "draw_rows",
    "Sampler",
    "make_sampler",
    "make_logits_processors",
    "BATCH_DRAW_ROWS",
]
