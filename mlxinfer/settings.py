"""Sampler settings: what the sampler does, checked, and merged with a model's
generation_config.json. No mlx here, so a front end can check its options before a model loads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable, Iterable, Mapping

from .errors import MlxinferError, is_number, is_whole, shown
from .plain import plain

ORDERS = ("temperature-first", "mlx-lm")
ORDER_ALIASES = {"lesson": "temperature-first"}  # the name it had first

# A positive temperature under this divides float32 scores into inf and the softmax into NaN (1e-6 is
# already greedy in all but exact ties); a repetition penalty outside [TINY, 1/TINY] does the same.
TINY = 1e-6


def _bias(v) -> bool:
    return (
        v is None
        or isinstance(v, dict)
        and all(is_whole(t) and t >= 0 and is_number(b) and -100 <= b <= 100 for t, b in v.items())
    )


def option(
    default,
    kind: type,
    ok: Callable[[Any], bool],
    must_be: str,
    help: str | None = None,
    *,
    flags: str = "",
    group: str = "sampling",
    grid: int = 0,
    served: bool = False,
    from_config: bool = False,
):
    """A sampler setting, declared once: its default, its type, its rule (`ok`, and what it `must_be`: the
    fix a message gives), and where it appears. flags: the CLI's flags ("" = not on the command line), in
    its option `group` ("sampling": every command that samples; "penalties": generate's and the server's);
    grid: its place among the value lists `sweep` crosses (0 = not crossed); served: a request field of the
    server; from_config: read from a model's generation_config.json."""
    meta = dict(kind=kind, ok=ok, must_be=must_be, help=help, flags=flags, group=group, grid=grid, served=served)
    return field(default=default, metadata={**meta, "from_config": from_config})


@dataclass(frozen=True)
class SamplerSettings:
    temperature: float = option(
        1.0,
        float,
        lambda v: is_number(v) and (v == 0 or v >= TINY),
        ">= 0 (0 = greedy, else at least 1e-06, and finite; e.g. 0.7)",
        "The sampler's temperature (one value): divide scores by T before softmax; 0 = greedy.",
        flags="--temp --temperature",
        grid=1,
        served=True,
        from_config=True,
    )
    top_k: int = option(
        0,
        int,
        lambda v: is_whole(v) and 0 <= v < 2**31,  # past any vocabulary; the native cut takes a 32-bit k
        "a whole number from 0 to 2,147,483,647 (0 or -1 = off; e.g. 20)",
        "Keep the k most likely tokens (0 or -1 = off).",
        flags="--top-k",
        grid=3,
        served=True,
        from_config=True,
    )
    top_p: float = option(
        1.0,
        float,
        lambda v: is_number(v) and 0 < v <= 1,
        "in (0, 1] (1 = off; e.g. 0.9)",
        "Keep the smallest set of top tokens holding at least p (1 = off).",
        flags="--top-p",
        grid=2,
        served=True,
        from_config=True,
    )
    min_p: float = option(
        0.0,
        float,
        lambda v: is_number(v) and 0 <= v < 1,
        "in [0, 1) (0 = off; e.g. 0.05)",
        "Keep tokens with at least this fraction of the top probability.",
        flags="--min-p",
        grid=4,
        served=True,
        from_config=True,
    )
    # locally typical sampling (Meister et al., 2023), as transformers' typical_p and llama.cpp's --typical
    typical_p: float = option(
        1.0,
        float,
        lambda v: is_number(v) and 0 < v <= 1,
        "in (0, 1] (1 = off; e.g. 0.9)",
        "Keep the tokens whose surprise is nearest the entropy, fewest first, holding at least p (1 = off).",
        flags="--typical-p",
        grid=5,
        served=True,
        from_config=True,
    )
    # no cut keeps fewer (mlx-lm order: only min-p honours it)
    min_tokens_to_keep: int = option(
        1, int, lambda v: is_whole(v) and 1 <= v < 2**31, "a whole number from 1 to 2,147,483,647"
    )
    # HF/mlx-lm: seen tokens' scores / p if > 0, * p if < 0
    repetition_penalty: float = option(
        1.0,
        float,
        lambda v: is_number(v) and TINY <= v <= 1 / TINY,
        "in [1e-06, 1e+06] (1 = off; e.g. 1.1)",
        "Divide seen tokens' positive scores by this, multiply their negative ones (1 = off).",
        flags="--repetition-penalty",
        group="penalties",
        served=True,
        from_config=True,
    )
    # OpenAI: minus this once for every token seen
    presence_penalty: float = option(
        0.0,
        float,
        lambda v: is_number(v) and -2 <= v <= 2,
        "in [-2, 2] as in OpenAI's API (0 = off)",
        "Subtract this from every seen token's score.",
        flags="--presence-penalty",
        group="penalties",
        served=True,
    )
    # OpenAI: minus this times the token's count
    frequency_penalty: float = option(
        0.0,
        float,
        lambda v: is_number(v) and -2 <= v <= 2,
        "in [-2, 2] as in OpenAI's API (0 = off)",
        "Subtract this times a token's count so far.",
        flags="--frequency-penalty",
        group="penalties",
        served=True,
    )
    # token id -> added to its score (the server takes OpenAI's string keys: server/schemas.py)
    logit_bias: dict[int, float] | None = option(None, dict, _bias, "a map of token ids >= 0 to biases in [-100, 100]")
    penalty_window: int | None = option(
        None,
        int,
        lambda v: v is None or is_whole(v) and 0 <= v < 2**31,  # the history is sliced with 32-bit indices
        "a whole number from 0 (penalties off) to 2,147,483,647, or -1 or unset for all",
        "The penalties look at the last N tokens, the prompt's included (default or -1: all; 0: off;"
        " mlx-lm's repetition_context_size, llama.cpp's --repeat-last-n).",
        flags="--penalty-window --repeat-last-n",
        group="penalties",
        served=True,
    )
    # or "mlx-lm": cut the untempered distribution, temper in the draw
    order: str = option(
        "temperature-first",
        str,
        lambda v: v in ORDERS,
        "'temperature-first' or 'mlx-lm'",
        "'temperature-first' (the lesson's) or 'mlx-lm' (cut, then temperature).",
        flags="--order",
        served=True,
    )

    def __post_init__(self):
        for f in fields(self):  # np.float32(0.7) is 0.7, as it is anywhere in a public call's arguments
            value = getattr(self, f.name)
            if plain(value) is not value:
                object.__setattr__(self, f.name, value := plain(value))
            if f.metadata["kind"] is float and is_whole(value) and abs(value) < 2**53:  # temperature=1 is 1.0,
                object.__setattr__(self, f.name, float(value))  # as the CLI reads it
        if is_whole(self.top_k) and self.top_k == -1:  # off, as vLLM and llama.cpp take it
            object.__setattr__(self, "top_k", 0)
        if is_whole(self.penalty_window) and self.penalty_window == -1:  # all, as llama.cpp's --repeat-last-n -1
            object.__setattr__(self, "penalty_window", None)
        if isinstance(self.order, str) and self.order in ORDER_ALIASES:
            object.__setattr__(self, "order", ORDER_ALIASES[self.order])

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def cuts_tail(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0 or self.typical_p < 1.0

    @property
    def adjusts(self) -> bool:
        return bool(self.logit_bias or self.presence_penalty or self.frequency_penalty) or self.repetition_penalty != 1

    def validate(self, where: str = "") -> "SamplerSettings":
        """Return self, or raise MlxinferError with one line naming the setting and the fix."""
        for f in fields(self):
            value = getattr(self, f.name)
            if not f.metadata["ok"](value):
                prefix = f"{where}: " if where else ""
                params = () if where else (f.name,)
                got = shown(value, f.metadata["kind"])
                raise MlxinferError(f"{prefix}{f.name} must be {f.metadata['must_be']}, got {got}", *params)
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def options(cls) -> list["SamplerOption"]:
        """Every setting as declared: what the CLI's flags, the server's request fields and sweep's grid
        are built from."""
        return [SamplerOption(f.name, f.default, **f.metadata) for f in fields(cls)]


@dataclass(frozen=True)
class SamplerOption:
    name: str
    default: Any
    kind: type
    ok: Callable[[Any], bool]
    must_be: str
    help: str | None
    flags: str
    group: str
    grid: int
    served: bool
    from_config: bool


GREEDY = SamplerSettings(temperature=0.0)
GRID_FIELDS = tuple(o.name for o in sorted(SamplerSettings.options(), key=lambda o: o.grid) if o.grid)  # sweep's axes
SAMPLING_FIELDS = tuple(o.name for o in SamplerSettings.options() if o.from_config)  # from generation_config.json


def check_temperature(value: Any, name: str = "temperature") -> float:
    """One temperature, by SamplerSettings' rule: finite and >= 0."""
    rule = fields(SamplerSettings)[0].metadata
    if not rule["ok"](value):
        raise MlxinferError(f"{name} must be {rule['must_be']}, got {shown(value, float)}", name)
    return float(value)


def _config_values(cfg: dict, where: str) -> dict:
    if not isinstance(cfg, dict):
        raise MlxinferError(f"{where} is not a JSON object; fix or delete the file")
    values = {k: cfg[k] for k in SAMPLING_FIELDS if cfg.get(k) is not None}
    if cfg.get("do_sample") is False:
        values["temperature"] = 0.0
    return values


def settings_list(settings, example: str = "[{'temperature': 0.7}]") -> list:
    """A non-empty list of settings entries (each a SamplerSettings or a dict), from any iterable once."""
    if isinstance(settings, (SamplerSettings, Mapping, str, bytes)) or not isinstance(settings, Iterable):
        raise MlxinferError(
            f"settings must be a non-empty list of settings (e.g. {example}), got {settings!r:.60}", "settings"
        )
    entries = list(settings)
    if not entries:
        raise MlxinferError(f"settings must be a non-empty list (e.g. {example}); it is empty", "settings")
    return entries


def resolve_each(settings: list, generation_config: dict | None) -> list[SamplerSettings]:
    """Each entry of a settings list resolved over generation_config.json; two entries that resolve to
    the same sampler are refused (a second column or cell equal to the first)."""
    resolved = [resolve_settings(s, generation_config)[0] for s in settings]
    twice = next((i for i, r in enumerate(resolved) if r in resolved[:i]), None)
    if twice is not None:
        first = resolved.index(resolved[twice])
        raise MlxinferError(
            f"settings #{first + 1} and #{twice + 1} are the same sampler ({settings[twice]!r:.60}); list each once",
            "settings",
        )
    return resolved


def user_settings(settings: Mapping[str, Any] | None) -> dict:
    """The fields a mapping of SamplerSettings fields sets (None values: not set), checked."""
    if settings is None:
        return {}
    if not isinstance(settings, (Mapping, SamplerSettings)):
        raise MlxinferError(
            f"settings must be a SamplerSettings, a dict of its fields or None, got {type(settings).__name__}",
            "settings",
        )
    if isinstance(settings, SamplerSettings):
        every = {f.name: getattr(settings.validate(), f.name) for f in fields(SamplerSettings)}
        return {k: v for k, v in every.items() if v is not None}
    names = {f.name for f in fields(SamplerSettings)}
    unknown = sorted(str(k) for k in set(settings) - names)  # a key that is no string is unknown too
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
        what = _show(settings, changed) if changed else "SamplerSettings() (temperature 1.0, nothing cut)"
        rest = f"no {where}" if generation_config is None else f"a SamplerSettings is whole: the {where} not read"
        return settings, f"sampling: {what} set by you; {rest}"
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
