"""The sampler's stages: small pure functions over MLX arrays, in the order the lesson gives them.

    scores -> adjustments (apply_logit_bias, apply_penalties, apply_mask)
           -> apply_temperature (divide by T) -> softmax / log_softmax
           -> cut the tail (apply_top_k, apply_top_p, apply_min_p, apply_typical_p) and rescale to 1

`cut_tail` is the cut as one setting chooses it; `kept_probabilities` is what a draw under those
settings draws from (the table, explain, sweep's first tokens and the exact answers read it).

fast=True (the CPU paths, whose scores are not mlx-lm's bits anyway): every exp over the vocabulary is
the CPU kernels' own (cpu/kernels.py: the native log-softmax, a polynomial exp), not MLX's CPU exp, which
takes ~12 ns an element, and top-p and typical-p are the extension's nodes, which sort only the tokens
they need and sum in float64. Which tokens a cut keeps can then differ from MLX's only where float32's
rounding decides: two tokens tied within the last bits, or (top-p, typical-p) the tail tokens whose mass
is within the float32 running sum's error of p (at p = 0.99 over 49k tokens, ~1e-5 of mass). A draw's
own arithmetic does not change (it reads the row's scores).
"""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from ..cpu import kernels
from ..errors import MlxinferError
from ..settings import SamplerSettings

NEG_INF = -float("inf")
# the least p the cuts compare in float32: a smaller one (1e-300) read as 0 there and kept nothing; every
# p at most the top token's probability keeps the same tokens, so the floor changes no cut
LEAST_P = float(np.finfo(np.float32).tiny)


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
    if history is not None and s.penalty_window is not None:  # 0: none of it (history[-0:] would be all)
        history = history[-s.penalty_window :] if s.penalty_window else history[:0]
    out = apply_penalties(out, history, s.repetition_penalty, s.presence_penalty, s.frequency_penalty)
    return apply_mask(out, allowed)


# ----------------------------------------------------------------------------- temperature, softmax
def apply_temperature(logits: mx.array, temperature: float) -> mx.array:
    """Divide every score by T, written ``logits * (1 / T)`` exactly as mlx-lm computes it:
    ``logits / T`` can differ in the last float32 bit, and that bit can flip a near-tie draw."""
    if temperature <= 0:
        raise MlxinferError(f"temperature {temperature} cannot divide the scores; 0 means greedy (argmax)")
    return logits if temperature == 1.0 else logits * (1.0 / temperature)  # x * 1.0 is x, bit for bit


def log_softmax(logits: mx.array, fast: bool = False) -> mx.array:
    """Log-probabilities: ``logits - logsumexp(logits)`` over the vocabulary (last axis)."""
    if fast:
        return kernels.log_softmax(logits)
    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def softmax(logits: mx.array, fast: bool = False) -> mx.array:
    return kernels.softmax(logits) if fast else mx.softmax(logits, axis=-1)


def _exp(x: mx.array, fast: bool) -> mx.array:
    return kernels.exp_kept(x) if fast else mx.exp(x)


def probabilities(logits: mx.array, temperature: float, fast: bool = False) -> mx.array:
    """softmax(logits / T) over the whole vocabulary; T = 0 puts all of it on the argmax."""
    if temperature == 0:
        return (mx.arange(logits.shape[-1]) == mx.argmax(logits, axis=-1, keepdims=True)).astype(mx.float32)
    return softmax(apply_temperature(logits, temperature), fast)


# ----------------------------------------------------------------------------- cutting the tail
# Each takes log-probabilities (any shift works) and returns them with the cut entries at -inf.
def apply_top_k(logprobs: mx.array, k: int, min_tokens_to_keep: int = 1, fast: bool = False) -> mx.array:
    """Keep the k highest (at least min_tokens_to_keep); k >= V keeps everything. fast: one native pass
    that also keeps every tie of the k-th (as transformers' top-k does); MLX's argpartition keeps k."""
    k = max(k, min_tokens_to_keep)
    if k >= logprobs.shape[-1]:
        return logprobs
    native = kernels.top_k(logprobs, k) if fast else None
    if native is not None:
        return native
    drop = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[..., k:]
    return mx.put_along_axis(logprobs, drop, mx.array(NEG_INF, logprobs.dtype), axis=-1)


def apply_top_p(logprobs: mx.array, p: float, min_tokens_to_keep: int = 1, fast: bool = False) -> mx.array:
    """Nucleus: keep the smallest set of top tokens whose probabilities add up to at least p.

    A token survives when the mass of the tokens above it is below p (of the row's total
    mass, so a row that was cut before counts as rescaled); mlx-lm's formulation, plus
    min_tokens_to_keep."""
    p = max(p, LEAST_P)
    native = kernels.top_p(logprobs, p, min_tokens_to_keep) if fast else None
    if native is not None:  # the same rule from a partial sort, its sums in float64
        return native
    vocab = logprobs.shape[-1]
    ordered = mx.sort(logprobs, axis=-1)
    probs = _exp(ordered.astype(mx.float32), fast)
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


def apply_typical_p(logprobs: mx.array, p: float, min_tokens_to_keep: int = 1, fast: bool = False) -> mx.array:
    """Locally typical sampling (Meister et al., 2023; transformers' TypicalLogitsWarper): order the tokens
    by how far their surprise -log p is from the distribution's entropy, nearest first, and keep the
    fewest whose probabilities add up to at least p (the token that crosses p is kept)."""
    p = max(p, LEAST_P)
    native = kernels.typical_p(logprobs, p, min_tokens_to_keep) if fast else None
    if native is not None:  # the same rule from a partial sort, in float64
        return native
    lp = log_softmax(logprobs, fast)  # over what earlier cuts kept (cut tokens: -inf, p = 0)
    probs = _exp(lp, fast)
    entropy = -mx.sum(mx.where(probs > 0, probs * lp, 0.0), axis=-1, keepdims=True)
    distance = mx.abs(-lp - entropy)  # inf for a cut token
    order = mx.argsort(distance, axis=-1)
    mass = mx.cumsum(mx.take_along_axis(probs, order, axis=-1), axis=-1)
    n_keep = mx.maximum((mass < p).sum(axis=-1, keepdims=True) + 1, min_tokens_to_keep)
    n_keep = mx.minimum(n_keep, logprobs.shape[-1])
    threshold = mx.take_along_axis(mx.take_along_axis(distance, order, axis=-1), n_keep - 1, axis=-1)
    return mx.where(distance > threshold, NEG_INF, logprobs)


def cut_tail(logprobs: mx.array, settings: SamplerSettings, fast: bool = False) -> mx.array:
    """The untempered log-probabilities with every token the cut removes set to -inf.

    "temperature-first": top-k, top-p, min-p, typical-p on the *tempered* distribution, each on what
    the one before left (so top-p counts the top-k survivors rescaled to 1), as transformers orders its
    warpers; every cut keeps at least min_tokens_to_keep. "mlx-lm": mlx-lm's top-p, min-p, top-k on the
    untempered row, then typical-p (which mlx-lm does not have) on what they left.
    Temperature 0 keeps only the argmax.
    """
    out = _cut(logprobs, settings, fast)
    if settings.greedy or not settings.cuts_tail or settings.order == "mlx-lm":
        return out
    return mx.where(out == NEG_INF, NEG_INF, logprobs)


def _cut(logprobs: mx.array, settings: SamplerSettings, fast: bool) -> mx.array:
    """cut_tail's cut: -inf exactly where cut_tail puts it, the kept entries as the last stage left them
    (tempered in the "temperature-first" order)."""
    s = settings
    if s.greedy:
        top = mx.argmax(logprobs, axis=-1, keepdims=True)
        return mx.where(mx.arange(logprobs.shape[-1]) == top, logprobs, NEG_INF)
    if not s.cuts_tail:
        return logprobs
    if s.order == "mlx-lm":  # mlx-lm's make_sampler: these three, in this order, untempered
        out = apply_top_p(logprobs, s.top_p, fast=fast) if s.top_p < 1.0 else logprobs
        out = apply_min_p(out, s.min_p, s.min_tokens_to_keep) if s.min_p > 0.0 else out
        out = apply_top_k(out, s.top_k, fast=fast) if s.top_k > 0 else out
        return apply_typical_p(out, s.typical_p, s.min_tokens_to_keep, fast) if s.typical_p < 1.0 else out
    keep = s.min_tokens_to_keep
    out = log_softmax(apply_temperature(logprobs, s.temperature), fast)
    out = apply_top_k(out, s.top_k, keep, fast) if s.top_k > 0 else out
    out = apply_top_p(out, s.top_p, keep, fast) if s.top_p < 1.0 else out
    out = apply_min_p(out, s.min_p, keep) if s.min_p > 0.0 else out
    return apply_typical_p(out, s.typical_p, keep, fast) if s.typical_p < 1.0 else out


def row_mass(x: mx.array, block: int = 64) -> mx.array:
    """Each row's sum (last axis, kept as 1), in blocks of `block`, then the blocks' sums in blocks: float32's
    plain sum of 49,152 probabilities lost ~1e-4 of them (the small ones, added to a large running sum),
    this loses ~1e-8."""
    while x.shape[-1] > block:
        pad = -x.shape[-1] % block
        x = mx.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, pad)]) if pad else x
        x = mx.sum(x.reshape(*x.shape[:-1], -1, block), axis=-1)
    return mx.sum(x, axis=-1, keepdims=True)


def kept_probabilities(scores: mx.array, settings: SamplerSettings, history=None, allowed=None, fast: bool = False):
    """What one draw under `settings` draws from, for raw scores (V,), or rows (A, V) that share their
    history and mask: the adjusted scores, each token's probability at the temperature over the whole
    vocabulary, whether the cut keeps it, and its probability as drawn (the kept rescaled to 1). The
    table's --explain, sweep's first tokens and the exact answers all read it, so they agree with the
    draw by construction."""
    x = adjust(scores.astype(mx.float32), settings, history, allowed)
    probs = probabilities(x, settings.temperature, fast)
    if settings.cuts_tail or settings.greedy:
        kept = _cut(log_softmax(x, fast), settings, fast) > NEG_INF  # cut_tail's -inf, without its last where
    else:  # no cut: what cut_tail(log_softmax(x)) keeps is what x does not hold at -inf, without its exp
        kept = x > NEG_INF
    held = mx.where(kept, probs, 0.0)
    return x, probs, kept, held / row_mass(held)


__all__ = [  # what mlxinfer.sampler exports from here
    "NEG_INF",
    "check_logit_bias",
    "apply_logit_bias",
    "apply_penalties",
    "apply_mask",
    "adjust",
    "apply_temperature",
    "log_softmax",
    "softmax",
    "probabilities",
    "apply_top_k",
    "apply_top_p",
    "apply_min_p",
    "apply_typical_p",
    "cut_tail",
    "kept_probabilities",
    "row_mass",
]
