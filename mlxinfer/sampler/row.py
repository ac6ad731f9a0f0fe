"""A row's draw, owned by the sampler: its seed's key chain, the tokens its penalties and mask read, its
processors, and the one chain from a step's scores to its token. The engine hands it scores and gets
tokens (`draw_batch`, every row in flight at once).

A seed's key chain is what MLX's global stream is after `mx.random.seed(seed)`, so a row draws what
mlx-lm draws for that seed alone, whatever else shares the batch, as long as the forward pass gives
each row the same bits alone or in a batch.
"""

from __future__ import annotations

from typing import Optional

import mlx.core as mx
import numpy as np

from .. import keychain
from ..cpu import kernels
from ..errors import MlxinferError
from ..settings import SamplerSettings
from .drawing import BATCH_DRAW_ROWS, draw_rows, make_logits_processors
from .stages import cut_tail


class RowSampler:
    """One row's sampler state through a generation. `mask` is a grammar mask (engine/constrain.py),
    a processor like the penalties, or None."""

    def __init__(self, settings: SamplerSettings, seed: Optional[int], history: mx.array, mask=None):
        self.settings = settings
        self.processors = make_logits_processors(settings) + ([mask] if mask is not None else [])
        self.key = None if seed is None else np.array(mx.random.key(seed))  # (2,) uint32; None: global stream
        self.history = history  # every token fed so far: what penalties and the mask read
        self.error: Optional[BaseException] = None  # a processor that failed (a grammar giving up): this row only

    def scores(self, logits: mx.array, fed: mx.array, fast: bool = False) -> mx.array:
        """Log-probabilities (1, V) from the scores (1, V) that followed the token `fed`, after this
        row's penalties and mask. fast: the CPU paths' own log-softmax (their scores are not mlx-lm's
        bits anyway); else generate_step's expression, the same bits as mlx-lm. A processor that fails
        is recorded in `error` (the row's driver ends it) and the row goes on unadjusted this step."""
        if self.processors:
            self.history = mx.concatenate([self.history, fed.astype(mx.int32)])
            try:
                for process in self.processors:
                    logits = process(self.history, logits)
            except Exception as e:  # noqa: BLE001 - any processor failure ends this row only
                self.error = e
        return kernels.log_softmax(logits) if fast else logits - mx.logsumexp(logits, keepdims=True)

    def failure(self) -> Optional[str]:
        """The processor's failure in one line, or None."""
        e = self.error
        return None if e is None else str(e) if isinstance(e, MlxinferError) else f"{type(e).__name__}: {e}"


def _split_keys(rows: list[RowSampler]) -> list:
    """Each row's key for this draw (None: the global stream): every seeded chain split once,
    as MLX's global stream would be, all rows in one numpy call (keychain.py)."""
    seeded = [i for i, row in enumerate(rows) if row.key is not None]
    keys = [None] * len(rows)
    if seeded:
        chains, subkeys = keychain.split(np.stack([rows[i].key for i in seeded]))
        for j, i in enumerate(seeded):
            rows[i].key, keys[i] = chains[j], subkeys[j]
    return keys


def _kept(logprobs: mx.array, settings: SamplerSettings, fast: bool) -> mx.array:
    """cut_tail's row, or the row itself when greedy: the draw is then its argmax, the one token
    cut_tail would keep (four ops over the vocabulary fewer a step)."""
    return logprobs if settings.greedy else cut_tail(logprobs, settings, fast)


def _draws_raw(row: RowSampler, fast: bool) -> bool:
    """Whether the row draws from its scores as they are (draw_batch): on the CPU paths, with nothing
    to adjust and no cut."""
    return fast and not row.processors and not row.settings.cuts_tail


def _stacked(rows: list[mx.array]) -> mx.array:
    return rows[0] if len(rows) == 1 else mx.concatenate(rows)  # one row: no copy of its V scores


def draw_batch(
    rows: list[RowSampler],
    logits: mx.array,
    fed: list[mx.array],
    n_alternatives: int,
    fast: bool,
    step_logprobs: bool,
    host_draw: bool = False,
):
    """One draw per row from its scores (A, V) (or (1, V) shared by all, a prefill's): tokens (A,),
    their log-probabilities (A,), and each row's best alternatives ((ids, logprobs) per row).

    Rows that share their settings and have nothing to adjust (no penalties, no mask) are
    normalised and cut in one op over (A, V): the same bits per row as one row at a time
    (checked by the tests), fewer dispatches. Each row draws with its own key; on a CPU all seeded
    rows are drawn in one call (draw.draw_rows), the tokens mx.random.categorical gives each.
    On the CPU paths (`fast`) a row with nothing to adjust and no cut draws from its scores as they
    are (`_draws_raw`): a draw does not depend on a shift of its row, and MLX's CPU exp over 49k
    scores a row was a sixth of a 64-row step. Such a row does so alone or batched, whether or not
    its logprobs are read, so a seed draws the same token in `generate`, `sample` and the server (a
    draw from the normalised row differs at a near tie: 2 seeds in 200 at T = 1.5). The draw's bits
    then differ from mlx-lm's in the last place, as these paths' scores already do.
    host_draw: the caller reads each step's tokens on the host before the next (the server's
    engine), so the native draw serves from one seeded row on: it has no lazy draw to lose.
    """
    settings, A = rows[0].settings, len(rows)
    if A > 1 and all(not r.processors and r.key is not None and r.settings == settings for r in rows):
        raw = _draws_raw(rows[0], fast)
        if raw and not step_logprobs:
            logprobs = logits
        elif fast:
            logprobs = kernels.log_softmax(logits)
        else:
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)  # (A, V), or (1, V) shared
        logprobs = mx.broadcast_to(logprobs, (A, logprobs.shape[-1]))
        kept = mx.broadcast_to(logits, logprobs.shape) if raw else _kept(logprobs, settings, fast)
    else:
        row_logits = [logits if logits.shape[0] == 1 else logits[i : i + 1] for i in range(A)]
        rows_logprobs = [row.scores(row_logits[i], fed[i], fast) for i, row in enumerate(rows)]
        kept = _stacked([
            x if _draws_raw(row, fast) else _kept(lp, row.settings, fast)
            for x, lp, row in zip(row_logits, rows_logprobs, rows)
        ])  # fmt: skip
        logprobs = _stacked(rows_logprobs)
    temperatures, keys = [row.settings.temperature for row in rows], _split_keys(rows)
    y = draw_rows(kept, temperatures, keys, min_rows=1 if host_draw else BATCH_DRAW_ROWS)
    if not step_logprobs:
        return y, mx.zeros(y.shape), []
    chosen = mx.take_along_axis(logprobs, y[:, None], axis=-1)[:, 0]  # (A,)
    alternatives = []
    if n_alternatives:
        top = mx.argpartition(-logprobs, kth=n_alternatives - 1, axis=-1)[:, :n_alternatives]  # (A, K)
        alternatives = [(top[i], mx.take_along_axis(logprobs[i], top[i], axis=-1)) for i in range(len(rows))]
    return y, chosen, alternatives


__all__ = [  # what mlxinfer.sampler exports from here
    "RowSampler",
    "draw_batch",
]
