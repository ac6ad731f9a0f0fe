"""The one request path: (prompt, settings, constraint, chat options) -> what the decoder needs.

generate, stream_generate, sample, sweep and the server all start here, so every argument is
checked in one place (one MlxinferError naming the parameter).

    request = prepare(model, tokenizer, prompt, settings=..., max_tokens=...)  # checks, encodes
    specs = [request.row(seed) for seed in seeds]                                # one mask per row
    for row, step in decode.prefill_and_decode(model, tokenizer, request.ids, specs): ...
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from .. import defaults
from ..errors import MlxinferError, check_bool, check_whole, is_utf8, is_whole, shown
from ..sampler import check_logit_bias
from ..settings import SamplerSettings, resolve_settings
from ..tokenizer import encode_prompt, system_message, vocabulary
from .constrain import CompiledSchema, compile_schema
from .core import RowSpec, continues
from .decode import check_context
from .schema import Constraint, tool_system


@dataclass
class Request:
    """A checked request: the prompt's token ids, the resolved settings and where they came from,
    the token budget and the constraint (None: free text)."""

    ids: list[int]
    settings: SamplerSettings
    note: str  # where the sampling settings came from (yours, generation_config.json, defaults)
    max_tokens: int
    constraint: Optional[Constraint]
    compiled: Optional[CompiledSchema]  # the constraint's grammar for this tokenizer (compiled once)
    vocab_size: int
    stop: tuple[str, ...] = ()  # stop strings: a row's text ends before the first one
    after: tuple[int, ...] = ()  # the prompt's last tokens where a row's text continues them (core.continues)

    def row(self, seed: Optional[int], settings: Optional[SamplerSettings] = None) -> RowSpec:
        """One continuation of the prompt, with its own grammar mask."""
        explain = self.constraint is not None and self.constraint.explain
        mask = self.compiled.mask(self.vocab_size, explain=explain) if self.compiled is not None else None
        return RowSpec(seed, settings or self.settings, self.max_tokens, mask, self.stop, self.after)


PAIR = " (load() returns a pair: model, tokenizer = mlxinfer.load())"


def check_model(model, hint: str = PAIR) -> None:
    """model is the model load() returns (not a tokenizer, a pair, None or mlx-lm's), named here, not met later as
    an AttributeError deep inside; `hint`: the fix the message ends with."""
    if not (hasattr(model, "info") and hasattr(model, "config") and hasattr(model, "make_cache")):
        got = type(model).__name__
        if type(model).__module__.startswith("mlx_lm."):  # mlx_lm.load's: ours is another class of that name
            got = f"{type(model).__module__}.{got}"
            hint = "; mlxinfer.load(path) reads the same checkpoint (and mlx_lm_twin(model) gives mlx-lm ours)"
        raise MlxinferError(f"model must be the model load() returns, got {got}{hint}", "model")


def check_pair(model, tokenizer) -> None:
    """model and tokenizer are what load() returns: a (model, tokenizer) pair passed whole, None, or the
    two swapped are named here, not met later as an AttributeError deep inside."""
    check_model(model)
    if not (hasattr(tokenizer, "encode") and hasattr(tokenizer, "decode") and hasattr(tokenizer, "eos_token_ids")):
        got = type(tokenizer).__name__
        raise MlxinferError(f"tokenizer must be the tokenizer load() returns, got {got}{PAIR}", "tokenizer")
    if model.info.vocabulary and vocabulary(tokenizer) != model.info.vocabulary:
        raise MlxinferError(
            f"the tokenizer is not this model's: its vocabulary ({vocabulary(tokenizer).split(',')[0]}) is not the one "
            f"loaded with the model ({model.info.vocabulary.split(',')[0]}){PAIR}",
            "tokenizer",
        )


def prepare(
    model,
    tokenizer,
    prompt: str | list[int],
    *,
    settings: SamplerSettings | Mapping[str, Any] | None = None,
    max_tokens: int = defaults.MAX_TOKENS_GENERATE,
    json_schema: dict | str | None = None,
    tool: dict | str | None = None,
    chat: bool = True,
    system: Optional[str] = None,
    thinking: bool = False,
    raw_special_tokens: bool = False,
    explain_mask: bool = False,
    or_text: bool = False,
    stop: str | Sequence[str] | None = None,
) -> Request:
    """Check the arguments, read the constraint (a tool adds its system text), resolve the settings
    over generation_config.json, encode the prompt (user text is never control tokens) and check
    that prompt + max_tokens fit the context. or_text: plain text is an answer too, besides the
    JSON (OpenAI's tool_choice "auto"; the text cannot start with "{"). stop: a string or strings
    where a row's text ends (returned up to the first one, finish_reason "stop")."""
    check_pair(model, tokenizer)
    switches = dict(chat=chat, thinking=thinking, raw_special_tokens=raw_special_tokens, explain_mask=explain_mask)
    for name, value in {**switches, "or_text": or_text}.items():  # before any is read as true or false
        check_bool(value, name)
    check_max_tokens(max_tokens)
    stops = stop_strings(stop)
    constraint = Constraint.read(json_schema, tool, explain_mask, or_text)  # bad schemas fail here
    if constraint is not None and constraint.tool is not None and not chat:
        raise MlxinferError(
            "tool is described to the model in a system message of the chat template, which chat=False skips; "
            "to constrain plain text to the tool's input, pass its input_schema as json_schema",
            "tool",
            "chat=False",
            "json_schema",
        )
    own = system_message(prompt) is not None
    if constraint is not None and constraint.tool is not None and system is None and not own:
        system = tool_system(constraint.tool)  # the messages' own system message, where there is one, stands
    resolved, note = resolve_settings(settings, model.info.generation_config)
    check_logit_bias(resolved.logit_bias, model.config.vocab_size)  # here, before a row is queued
    context = model.config.max_position_embeddings
    ids = encode_prompt(
        tokenizer, prompt, chat=chat, system=system, thinking=thinking, raw_special_tokens=raw_special_tokens,
        context=context,
    )  # fmt: skip
    check_context(model, len(ids), max_tokens)
    compiled = None
    if constraint is not None:
        compiled = compile_schema(tokenizer, constraint.schema, constraint.where, constraint.param, or_text)
    after = continues(prompt, chat, ids)
    return Request(ids, resolved, note, max_tokens, constraint, compiled, model.config.vocab_size, stops, after)


def stop_strings(stop: str | Sequence[str] | None) -> tuple[str, ...]:
    """stop as a tuple of strings, checked: each non-empty, at most MAX_STOPS of at most MAX_STOP_CHARS."""
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    most, longest = defaults.MAX_STOPS, defaults.MAX_STOP_CHARS
    if (
        isinstance(stops, (bytes, dict))
        or not isinstance(stops, Sequence)
        or not all(isinstance(s, str) and 0 < len(s) <= longest for s in stops)
        or len(stops) > most
    ):
        raise MlxinferError(
            f"stop must be a string or a list of at most {most} non-empty strings of at most {longest} "
            f"characters, got {stop!r:.80}",
            "stop",
        )
    for s in stops:
        if not is_utf8(s):  # a surrogate (bytes a shell passed that are not UTF-8): no token holds it
            raise MlxinferError(f"stop {s!r:.80} is not valid UTF-8 text; pass it as UTF-8", "stop")
    return tuple(stops)


def check_max_tokens(max_tokens: int) -> None:
    if is_whole(max_tokens) and max_tokens == -1:  # llama.cpp's "no limit"
        raise MlxinferError(
            "max_tokens must be a whole number, at least 1, got -1 (llama.cpp's no limit): give the most tokens to "
            "write; the context bounds them too",
            "max_tokens",
        )
    check_whole(max_tokens, "max_tokens", 1, "a whole number, at least 1")


def check_seed(seed: Optional[int]) -> None:
    if seed is not None and not _is_seed(seed):
        fresh = "; leave it out for a fresh one (llama.cpp's -1)" if is_whole(seed) and seed == -1 else ""
        raise MlxinferError(f"seed must be a whole number >= 0 and below 2**63, got {seed!r}{fresh}", "seed")


def _is_seed(s) -> bool:
    return is_whole(s) and 0 <= s < defaults.SEED_LIMIT


def seed_list(seeds: int | str | Sequence[int]) -> list[int]:
    """N (seeds 0..N-1), 'A:B' (A..B-1, like Python's range) or the seeds themselves."""
    most = defaults.MAX_SEEDS
    if type(seeds).__module__ == "numpy" and getattr(seeds, "ndim", 0) == 1:
        seeds = seeds.tolist()  # np.arange(10): the seeds themselves
    if isinstance(seeds, (bool, float, bytes, Mapping)) or seeds is None or not isinstance(seeds, (int, str, Iterable)):
        raise MlxinferError(f"seeds must be a count, 'A:B' or a list of seeds, got {seeds!r:.60}", "seeds")
    if isinstance(seeds, str) and ":" not in seeds and seeds.isascii():
        try:
            seeds = int(seeds)  # Python's int(), as the whole-number options and A:B read theirs ("1_000")
        except ValueError:
            pass  # not a count: the message below
    if isinstance(seeds, int):
        if not 1 <= seeds <= most:
            raise MlxinferError(
                f"seeds must be at least 1 and at most {most:,}, got {seeds:,}; split it into runs of seeds A:B",
                "seeds",
            )
        return list(range(seeds))
    if isinstance(seeds, str):
        try:
            if not seeds.isascii():
                raise ValueError
            a, b = (int(x) for x in seeds.split(":"))
        except ValueError:
            raise MlxinferError(f"seeds takes N or A:B with whole numbers, got '{seeds}'", "seeds") from None
        if a < 0:
            raise MlxinferError(f"seeds {seeds} starts below 0; seeds are whole numbers (A:B with 0 <= A < B)", "seeds")
        if b <= a:
            raise MlxinferError(f"seeds {seeds} is empty or reversed; use A:B with 0 <= A < B", "seeds")
        if b - a > most or b > defaults.SEED_LIMIT:
            raise MlxinferError(f"seeds {seeds}: at most {most:,} seeds, each below 2**63", "seeds")
        return list(range(a, b))
    out = list(seeds)
    if not out:
        raise MlxinferError("seeds is an empty list; give at least one seed (e.g. [0, 1, 2] or a count)", "seeds")
    bad = [s for s in out if not _is_seed(s)]
    if bad:
        got = f"{shown(bad[0]):.40}"
        raise MlxinferError(f"seeds must be whole numbers from 0 to 2**63 - 1, got {got} among them", "seeds")
    if len(out) > most:
        raise MlxinferError(f"seeds: at most {most:,}, got {len(out):,}", "seeds")
    repeated = next((s for s, n in collections.Counter(out).items() if n > 1), None)
    if repeated is not None:  # a seed draws the same completion each time: a tally would count one draw twice
        raise MlxinferError(
            f"seeds lists {repeated} more than once; a seed draws the same completion each time, so a tally or "
            "a results file would hold one draw twice: list each seed once",
            "seeds",
        )
    return out


def check_batch_size(batch_size: Optional[int]) -> int:
    if batch_size is None:
        return defaults.BATCH_SIZE
    check_whole(batch_size, "batch_size", 1, "a whole number, at least 1")
    return batch_size
