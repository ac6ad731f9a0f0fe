"""Sampler settings: what the sampler does, checked, and merged with a model's
generation_config.json. No mlx here, so a front end can check its options before a model loads.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Mapping

from .errors import MlxinferError

ORDERS = ("temperature-first", "mlx-lm")
ORDER_ALIASES = {"lesson": "temperature-first"}  # the name it had first
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty")  # read from generation_config.json


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
    order: str = "temperature-first"  # or "mlx-lm" (cut the untempered distribution, temper in the draw)

    def __post_init__(self):
        if isinstance(self.order, str) and self.order in ORDER_ALIASES:
            object.__setattr__(self, "order", ORDER_ALIASES[self.order])

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
                prefix = f"{where}: " if where else ""
                raise MlxinferError(f"{prefix}{name} must be {rule}, got {value!r}", *(() if where else (name,)))
        return self

    def to_dict(self) -> dict:
        return asdict(self)


GREEDY = SamplerSettings(temperature=0.0)


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# A positive temperature under this divides float32 scores into inf and the softmax into NaN (1e-6 is
# already greedy in all but exact ties); a repetition penalty outside [TINY, 1/TINY] does the same.
TINY = 1e-6

_RULES = (  # (setting, test, what it must be: the fix)
    ("temperature", lambda v: _num(v) and (v == 0 or v >= TINY), ">= 0 (0 = greedy, else at least 1e-06; e.g. 0.7)"),
    ("top_p", lambda v: _num(v) and 0 < v <= 1, "in (0, 1] (1 = off; e.g. 0.9)"),
    ("top_k", lambda v: _int(v) and v >= 0, "a whole number >= 0 (0 = off; e.g. 20)"),
    ("min_p", lambda v: _num(v) and 0 <= v < 1, "in [0, 1) (0 = off; e.g. 0.05)"),
    ("min_tokens_to_keep", lambda v: _int(v) and v >= 1, "a whole number >= 1"),
    ("repetition_penalty", lambda v: _num(v) and TINY <= v <= 1 / TINY, "in [1e-06, 1e+06] (1 = off; e.g. 1.1)"),
    ("presence_penalty", lambda v: _num(v) and -2 <= v <= 2, "in [-2, 2] as in OpenAI's API (0 = off)"),
    ("frequency_penalty", lambda v: _num(v) and -2 <= v <= 2, "in [-2, 2] as in OpenAI's API (0 = off)"),
    (
        "logit_bias",
        lambda v: (
            v is None
            or isinstance(v, dict)
            and all(_int(t) and t >= 0 and _num(b) and -100 <= b <= 100 for t, b in v.items())
        ),
        "a map of token ids >= 0 to biases in [-100, 100]",
    ),
    ("penalty_window", lambda v: v is None or _int(v) and v >= 1, "None (all) or a whole number >= 1"),
    ("order", lambda v: v in ORDERS, "'temperature-first' or 'mlx-lm'"),
)


def check_temperature(value: Any, name: str = "temperature") -> float:
    """One temperature, by SamplerSettings' rule: finite and >= 0."""
    if not _RULES[0][1](value):
        raise MlxinferError(f"{name} must be {_RULES[0][2]}, got {value!r}", name)
    return float(value)


def _config_values(cfg: dict, where: str) -> dict:
    if not isinstance(cfg, dict):
        raise MlxinferError(f"{where} is not a JSON object; fix or delete the file")
    values = {k: cfg[k] for k in SAMPLING_FIELDS if cfg.get(k) is not None}
    if cfg.get("do_sample") is False:
        values["temperature"] = 0.0
    return values


def user_settings(settings: Mapping[str, Any] | None) -> dict:
    """The fields a mapping of SamplerSettings fields sets (None values: not set), checked."""
    if settings is None:
        return {}
    if not isinstance(settings, Mapping):
        raise MlxinferError(
            f"settings must be a SamplerSettings, a dict of its fields or None, got {type(settings).__name__}",
            "settings",
        )
    names = {f.name for f in fields(SamplerSettings)}
    unknown = sorted(set(settings) - names)
    if unknown:
        raise MlxinferError(
            f"unknown sampling setting(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}", "settings"
        )
    mine = {k: v for k, v in settings.items() if v is not None}
    replace(SamplerSettings(), **mine).validate()
    return mine


def resolve_settings(
    settings: SamplerSettings | Mapping[str, Any] | None,
    generation_config: dict | None,
    where: str = "generation_config.json",
) -> tuple[SamplerSettings, str]:
    """Merge what the caller set over the model's generation_config.json, field by field, then
    SamplerSettings' defaults. Returns the settings and a one-line note saying where the values
    came from. A SamplerSettings is taken whole (every field set by the caller)."""
    if isinstance(settings, SamplerSettings):
        changed = _changed(settings.validate())
        what = _show(settings, changed) if changed else "mlxinfer defaults (temperature 1.0, nothing cut)"
        return settings, f"sampling: {what}, set by you"
    mine = user_settings(settings)
    from_cfg, overridden = {}, []
    if generation_config is not None:
        in_cfg = _config_values(generation_config, where)
        from_cfg = {k: v for k, v in in_cfg.items() if k not in mine}
        overridden = [k for k in in_cfg if k in mine]
        replace(SamplerSettings(), **from_cfg).validate(where)
    resolved = replace(SamplerSettings(), **{**from_cfg, **mine}).validate()
    parts = [f"{_show(resolved, mine)} set by you"] if mine else []
    if from_cfg:
        greedy = generation_config.get("do_sample") is False and "temperature" in from_cfg
        parts.append(
            f"{_show(resolved, from_cfg)} from the model's {where}" + (" (do_sample false: greedy)" if greedy else "")
        )
    elif overridden:
        parts.append(f"the {where}'s {', '.join(overridden)} overridden")
    else:
        parts.append(f"no {where}" if generation_config is None else f"{where} sets no sampling option")
    if not mine and not from_cfg:
        parts.insert(0, "mlxinfer defaults (temperature 1.0, nothing cut)")
    return resolved, "sampling: " + "; ".join(parts)


def _changed(settings: SamplerSettings) -> list[str]:
    default = SamplerSettings()
    return [f.name for f in fields(SamplerSettings) if getattr(settings, f.name) != getattr(default, f.name)]


def _show(settings: SamplerSettings, keys) -> str:
    return ", ".join(f"{k} {getattr(settings, k)}" for k in keys)
