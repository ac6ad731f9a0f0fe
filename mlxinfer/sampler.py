"""The sampler: the code after the model that turns one row of scores into one token.

The lesson's chain, each stage a small pure function over MLX arrays:

    scores -> adjustments (apply_logit_bias, apply_penalties, apply_mask)
           -> apply_temperature (divide by T) -> softmax / log_softmax
           -> cut the tail (apply_top_k, apply_top_p, apply_min_p) and rescale to 1
           -> draw one token                      temperature 0: argmax instead

Two orders of the last steps (``SamplerSettings.order``):

* ``"lesson"`` (default) is the order the lesson describes: divide by the temperature
  first, then cut the tail of the tempered probabilities (as transformers and vLLM do).
* ``"mlx-lm"`` reproduces ``mlx_lm.sample_utils.make_sampler``: it cuts the tail of the
  *untempered* log-probabilities (top-p, then min-p, then top-k) and applies the
  temperature only in the draw, ``mx.random.categorical(logprobs * (1 / T))``.

Top-k keeps the same tokens in either order; top-p and min-p do not. With no cut the two
orders are the same computation, and the draw is token-for-token identical to mlx-lm's
under the same ``mx.random.seed``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from typing import Callable, Sequence

import mlx.core as mx

from .errors import MlxinferError

ORDERS = ("lesson", "mlx-lm")
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")  # read from generation_config.json
NEG_INF = -float("inf")


# ----------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class SamplerSettings:
    temperature: float = 1.0  # 0 = greedy (argmax), whatever else is set
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1.0 = off
    min_p: float = 0.0  # 0.0 = off
    min_tokens_to_keep: int = 1  # no cut keeps fewer (mlx-lm order: only min-p honours it)
    repetition_penalty: float = 1.0  # 1.0 = off; HF/mlx-lm: seen scores / p if > 0, * p if < 0
    presence_penalty: float = 0.0  # OpenAI: minus this once for every token seen
    frequency_penalty: float = 0.0  # OpenAI: minus this times the token's count
    logit_bias: dict[int, float] | None = None  # token id -> added to its score
    penalty_window: int | None = None  # penalties look at the last N tokens; None = all given
    order: str = "lesson"  # or "mlx-lm"

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def cuts_tail(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0

    @property
    def adjusts(self) -> bool:
        return bool(self.logit_bias or self.presence_penalty or self.frequency_penalty) or self.repetition_penalty != 1

    def validate(self, where: str = "") -> "SamplerSettings":
        """Return self, or raise MlxinferError with one line naming the setting and the fix."""
        for name, ok, rule in _RULES:
            value = getattr(self, name)
            if not ok(value):
                raise MlxinferError(f"{where + ': ' if where else ''}{name} must be {rule}, got {value!r}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_generation_config(cls, cfg: dict, where: str = "generation_config.json") -> "SamplerSettings":
        """The sampling fields of a generation_config.json (those it lacks stay off); do_sample
        false means greedy. A *missing* do_sample, which transformers reads as false, keeps the
        file's fields: "an app that never sets a temperature gets this file's settings"."""
        return replace(cls(), **_config_values(cfg, where)).validate(where)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


_RULES = (  # (setting, test, what it must be: the fix)
    ("temperature", lambda v: _num(v) and v >= 0, ">= 0 (0 = greedy; e.g. 0.7)"),
    ("top_p", lambda v: _num(v) and 0 < v <= 1, "in (0, 1] (1 = off; e.g. 0.9)"),
    ("top_k", lambda v: _int(v) and v >= 0, "a whole number >= 0 (0 = off; e.g. 20)"),
    ("min_p", lambda v: _num(v) and 0 <= v < 1, "in [0, 1) (0 = off; e.g. 0.05)"),
    ("min_tokens_to_keep", lambda v: _int(v) and v >= 1, "a whole number >= 1"),
    ("repetition_penalty", lambda v: _num(v) and v > 0, "> 0 (1 = off; e.g. 1.1)"),
    ("presence_penalty", lambda v: _num(v) and -2 <= v <= 2, "in [-2, 2] as in OpenAI's API (0 = off)"),
    ("frequency_penalty", lambda v: _num(v) and -2 <= v <= 2, "in [-2, 2] as in OpenAI's API (0 = off)"),
    ("logit_bias", lambda v: v is None or isinstance(v, dict) and all(
        _int(t) and t >= 0 and _num(b) and -100 <= b <= 100 for t, b in v.items()),
     "a map of token ids >= 0 to biases in [-100, 100]"),
    ("penalty_window", lambda v: v is None or _int(v) and v >= 1, "None (all) or a whole number >= 1"),
    ("order", lambda v: v in ORDERS, "'lesson' or 'mlx-lm'"),
)


def _config_values(cfg: dict, where: str) -> dict:
    if not isinstance(cfg, dict):
        raise MlxinferError(f"{where} is not a JSON object; fix or delete the file")
    values = {k: cfg[k] for k in SAMPLING_FIELDS if cfg.get(k) is not None}
    if cfg.get("do_sample") is False:
        values["temperature"] = 0.0
    return values


def resolve_settings(user: dict, generation_config: dict | None,
                     where: str = "generation_config.json") -> tuple[SamplerSettings, str]:
    """Merge the options the user set (``user``: field name -> value, None = not set) over the
    model's generation_config.json, field by field, then SamplerSettings' defaults. Returns
    the settings and a one-line note saying where the values came from."""
    names = {f.name for f in fields(SamplerSettings)}
    unknown = sorted(set(user) - names)
    if unknown:
        raise MlxinferError(f"unknown sampling option(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    mine = {k: v for k, v in user.items() if v is not None}
    from_cfg = {}
    if generation_config is not None:
        from_cfg = {k: v for k, v in _config_values(generation_config, where).items() if k not in mine}
        replace(SamplerSettings(), **from_cfg).validate(where)
    settings = replace(SamplerSettings(), **{**from_cfg, **mine}).validate()

    def show(keys):
        return ", ".join(f"{k} {getattr(settings, k)}" for k in keys)

    parts = [f"{show(mine)} set by you"] if mine else []
    if from_cfg:
        greedy = generation_config.get("do_sample") is False and "temperature" in from_cfg
        parts.append(f"{show(from_cfg)} from the model's {where}" + (" (do_sample false: greedy)" if greedy else ""))
    else:
        parts.append(f"no {where}" if generation_config is None else f"{where} sets no sampling option")
    if not mine and not from_cfg:
        parts.insert(0, "mlxinfer defaults (temperature 1.0, nothing cut)")
    return settings, "sampling: " + "; ".join(parts)


# ----------------------------------------------------------------------------- adjustments
def _tokens(history, vocab_size: int) -> mx.array:
    tokens = history if isinstance(history, mx.array) else mx.array(list(history), dtype=mx.int32)
    tokens = tokens.reshape(-1).astype(mx.int32)
    if tokens.size and (mx.min(tokens).item() < 0 or mx.max(tokens).item() >= vocab_size):
        raise MlxinferError(f"history has token ids outside 0..{vocab_size - 1}; pass ids from this model's vocabulary")
    return tokens


def apply_logit_bias(logits: mx.array, bias: dict[int, float] | None) -> mx.array:
    """Add ``bias[token]`` to that token's score (OpenAI's logit_bias)."""
    if not bias:
        return logits
    vocab = logits.shape[-1]
    if max(bias) >= vocab:
        raise MlxinferError(f"logit_bias names token {max(bias)} but the vocabulary has {vocab}; use ids below that")
    idx = mx.array(list(bias.keys()), dtype=mx.int32)
    return logits.at[..., idx].add(mx.array(list(bias.values()), dtype=logits.dtype))


def apply_penalties(logits: mx.array, history, repetition_penalty: float = 1.0,
                    presence_penalty: float = 0.0, frequency_penalty: float = 0.0) -> mx.array:
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


def apply_mask(logits: mx.array, allowed: mx.array | None) -> mx.array:
    """Set every token where ``allowed`` (bool, shape (V,)) is False to -inf: probability
    exactly 0. The hook for a grammar mask."""
    if allowed is None:
        return logits
    if allowed.shape[-1] != logits.shape[-1]:
        raise MlxinferError(f"mask has {allowed.shape[-1]} entries but the vocabulary has {logits.shape[-1]}")
    if not mx.any(allowed).item():
        raise MlxinferError("the mask allows no token; the grammar must allow at least one")
    return mx.where(allowed, logits, NEG_INF)


def adjust(logits: mx.array, settings: SamplerSettings, history=None, allowed=None) -> mx.array:
    """All adjustments in mlx-lm's processor order: bias, penalties, then the mask."""
    s = settings
    out = apply_logit_bias(logits, s.logit_bias)
    if history is not None and s.penalty_window is not None:
        history = history[-s.penalty_window:]
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

    "lesson": top-k, top-p, min-p on the *tempered* distribution, each on what the one
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


def draw(logprobs: mx.array, temperature: float) -> mx.array:
    """One token per row from softmax(logprobs / T), T = 0: the argmax. Cut tokens (-inf) are
    never drawn; the kept ones are rescaled to 1 by the softmax. Seed with mx.random.seed."""
    if temperature == 0:
        return mx.argmax(logprobs, axis=-1)
    return _categorical(logprobs, temperature)


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

    def draw(self, logprobs: mx.array) -> mx.array:
        row = cut_tail(logprobs, self.settings)
        return draw(row, self.settings.temperature)

    def __call__(self, logits: mx.array, history=None, allowed=None) -> mx.array:
        if logits.size != logits.shape[-1]:
            raise MlxinferError(f"the sampler takes one row of scores, got shape {tuple(logits.shape)}")
        row = adjust(logits.reshape(1, -1), self.settings, history, allowed)
        # generate_step's own expression, to the letter (no axis on a (1, V) row): same bits
        return self.draw(row - mx.logsumexp(row, keepdims=True))


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


# ----------------------------------------------------------------------------- views
@dataclass
class ExplainRow:
    rank: int
    token: int
    score: float  # after the adjustments, before the temperature
    prob: float  # at the temperature, over the whole vocabulary, before the cut
    kept: bool
    final_prob: float  # after the cut, rescaled to 1 (0 when cut)
    text: str | None = None


@dataclass
class Explanation:
    settings: dict
    vocab_size: int
    n_kept: int
    mass_kept: float  # share of the temperature-T probability the cut keeps
    mass_cut: float
    rows: list[ExplainRow] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _probs_at(logits: mx.array, temperature: float) -> mx.array:
    if temperature == 0:
        return (mx.arange(logits.shape[-1]) == mx.argmax(logits)).astype(mx.float32)
    return softmax(apply_temperature(logits, temperature))


def explain(logits: mx.array, settings: SamplerSettings, k: int = 10,
            decode: Callable[[int], str] | None = None, history=None, allowed=None) -> Explanation:
    """One step of the sampler as a table: the k best tokens by score, their probability
    at the temperature, whether the cut keeps them and their rescaled probability."""
    settings.validate()
    x = adjust(logits.reshape(-1).astype(mx.float32), settings, history, allowed)
    probs = _probs_at(x, settings.temperature)
    kept = cut_tail(log_softmax(x), settings) > NEG_INF
    mass_kept = mx.sum(mx.where(kept, probs, 0.0))
    final = mx.where(kept, probs, 0.0) / mass_kept
    top = mx.argsort(-x)[: min(k, x.shape[-1])]
    ids, scores, p, kp, fp = (a.tolist() for a in (top, x[top], probs[top], kept[top], final[top]))
    rows = [ExplainRow(r + 1, ids[r], scores[r], p[r], bool(kp[r]), fp[r], decode(ids[r]) if decode else None)
            for r in range(len(ids))]
    mk = mass_kept.item()
    return Explanation(settings.to_dict(), x.shape[-1], int(mx.sum(kept).item()), mk, 1.0 - mk, rows)


@dataclass
class ProbabilityTable:
    tokens: list[int]  # the k best by score, best first
    scores: list[float]
    probs: dict[float, list[float]]  # temperature -> probability of each row (whole-vocabulary softmax)
    mass: dict[float, float]  # temperature -> total probability the k rows hold
    vocab_size: int
    texts: list[str] | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def probability_table(logits: mx.array, temps: Sequence[float] = (0.5, 1.0, 1.5), k: int = 6,
                      decode: Callable[[int], str] | None = None) -> ProbabilityTable:
    """The lesson's table: the top k tokens by score and their probability at each temperature."""
    x = logits.reshape(-1).astype(mx.float32)
    if any(t < 0 for t in temps):
        raise MlxinferError(f"temperatures must be >= 0, got {list(temps)}")
    top = mx.argsort(-x)[: min(k, x.shape[-1])]
    probs = {t: _probs_at(x, t)[top].tolist() for t in temps}
    ids = top.tolist()
    return ProbabilityTable(ids, x[top].tolist(), probs, {t: sum(v) for t, v in probs.items()},
                            x.shape[-1], [decode(i) for i in ids] if decode else None)


# ----------------------------------------------------------------------------- logprobs
def logprob(p: float) -> float:
    """The log of a probability: Apple at 0.574 -> -0.555."""
    return math.log(p)


def token_logprob(logits: mx.array, token: int) -> float:
    """The log-probability of ``token`` under softmax(logits) (no temperature, no cut)."""
    return log_softmax(logits.reshape(-1).astype(mx.float32))[token].item()


def top_logprobs(logits: mx.array, k: int) -> list[tuple[int, float]]:
    """The k most likely tokens and their log-probabilities, best first (OpenAI's top_logprobs)."""
    lp = log_softmax(logits.reshape(-1).astype(mx.float32))
    top = mx.argsort(-lp)[:k]
    return list(zip(top.tolist(), lp[top].tolist()))

