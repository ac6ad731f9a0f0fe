"""A walked path's children: the next token's probability under each settings entry after each path of a
forward pass, and which children the walk follows (engine/answers.py keeps the tree; this is its arithmetic).

Probabilities are the sampler's own (sampler.kept_probabilities: the scores adjusted, tempered and cut as a
draw of `sample` cuts them); a child's conditional probability is divided by its row's whole kept sum in
float64, so that a row holds exactly 1."""

from __future__ import annotations

from typing import Sequence

import mlx.core as mx
import numpy as np

from ..sampler import kept_probabilities, row_mass

BRANCHES = 1024  # children looked at per node at most (the rest is remainder)


def next_probabilities(logits: mx.array, paths: Sequence[tuple], settings, request, fast: bool) -> tuple:
    """(S, B, V) three times, for each settings entry after each path (logits (B, V)): each next token's
    probability at the entry's temperature, whether its cut keeps the token, and its probability as drawn
    (the kept rescaled to 1). A penalty or a grammar depends on the path, so those run a row at a time."""
    history_free = all(not s.adjusts for s in settings) and request.compiled is None
    entries = []  # per settings entry: (probs, kept, drawn), each (B, V)
    for s in settings:
        if history_free:
            entries.append(kept_probabilities(logits, s, fast=fast)[1:])
            continue
        rows = []
        for b, path in enumerate(paths):
            allowed = _allowed(request, path) if request.compiled is not None else None
            history = request.ids + list(path)
            rows.append(kept_probabilities(logits[b], s, history=history, allowed=allowed, fast=fast)[1:])
        entries.append(tuple(mx.stack(column) for column in zip(*rows)))
    return tuple(_stacked(list(column)) for column in zip(*entries))


def branches(probs: mx.array, kept: mx.array, drawn: mx.array, weights: np.ndarray) -> tuple:
    """Each path's candidate children, from next_probabilities' arrays and the paths' probabilities
    weights (S, B): (ids per path, their conditional probabilities per path (S, k) float64, support (S, B):
    how many tokens each entry can draw). Where every entry's support is at most BRANCHES, every token an
    entry can draw is a candidate; else the BRANCHES heaviest under any entry."""
    mx.eval(probs, kept)
    p = np.asarray(probs)  # views of MLX's buffers, not copies (read only here)
    positive = np.asarray(kept) & (p > 0)
    support = np.count_nonzero(positive, axis=-1)  # (S, B)
    if support.max() <= BRANCHES:  # a cut support
        ids = [np.flatnonzero(row) for row in positive.any(axis=0)]
        picked = [np.where(positive[:, b, i], p[:, b, i], 0).astype(np.float64) for b, i in enumerate(ids)]
        total = np.stack([h.sum(axis=1) for h in picked], axis=1)  # (S, B): each entry's kept mass
    else:
        heaviest = mx.max(drawn * mx.array(weights.astype(np.float32))[:, :, None], axis=0)  # (B, V)
        top = mx.argpartition(-heaviest, kth=BRANCHES - 1, axis=-1)[:, :BRANCHES]
        taken = mx.take_along_axis(drawn, mx.broadcast_to(top[None], (drawn.shape[0], *top.shape)), axis=-1)
        total = np.array(row_mass(drawn)[..., 0]).astype(np.float64)  # (S, B): 1 but for float32's rounding
        ids, picked = np.array(top), np.array(taken).transpose(1, 0, 2)  # (B, k), (B, S, k)
    cond = [picked[b].astype(np.float64) / total[:, b, None] for b in range(len(ids))]
    return ids, cond, support


def followed(cond: np.ndarray, support: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Which of a path's candidates (cond (S, k)) the walk follows: each entry's heaviest up to 1 - eps of
    its mass. Returns (the followed candidates' indices, their conditional probabilities (S, n), what each
    entry loses (S,)). An entry loses nothing where every token it can draw is followed (a cut support):
    there its children are rescaled to sum to 1 exactly, so that no mass leaks in rounding."""
    keep = np.zeros(cond.shape[1], dtype=bool)
    for s in range(cond.shape[0]):
        order = np.argsort(-cond[s], kind="stable")
        mass = np.cumsum(cond[s][order])
        n = min(int(np.searchsorted(mass, 1.0 - eps)) + 1, len(order)) if eps > 0 else len(order)
        chosen = order[:n]
        keep[chosen[cond[s][chosen] > 0]] = True
    whole = (cond[:, keep] > 0).sum(axis=1) == support
    taken = cond[:, keep].sum(axis=1)
    cond = np.where(whole[:, None] & (taken[:, None] > 0), cond / np.where(taken > 0, taken, 1.0)[:, None], cond)
    # never below 0: a sum of rounded terms may pass 1 in its last bits
    lost = np.where(whole, 0.0, np.maximum(1.0 - taken, 0.0))
    kept = np.nonzero(keep)[0]
    return kept, cond[:, kept], lost


def _allowed(request, path: tuple) -> np.ndarray:
    mask = request.compiled.mask(request.vocab_size)
    mask.advance(list(path))
    return mask.allowed()


def _stacked(arrays: list[mx.array]) -> mx.array:
    return arrays[0][None] if len(arrays) == 1 else mx.stack(arrays)  # one entry: a view, no copy
