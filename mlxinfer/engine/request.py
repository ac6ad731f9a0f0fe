"""The one request path: (prompt, settings, constraint, chat options) -> what the decoder needs.

generate, stream_generate, sample, sweep and the server all start here, so every argument is
checked in one place (one MlxinferError naming the parameter), and all of them collect a row's
text and tokens with the same `Collector`.

    request = prepare(model, tokenizer, prompt, settings=..., max_tokens=...)  # checks, encodes
    specs = [request.row(seed) for seed in seeds]                                # one mask per row
    for i, step in decode.prefill_and_decode(model, tokenizer, request.ids, specs): ...
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from .. import defaults
from ..errors import MlxinferError
from ..sampler import check_logit_bias
from ..settings import SamplerSettings, resolve_settings
from ..tokenizer import encode_prompt
from ..views import Step
from .constrain import CompiledSchema, JsonResult, compile_schema, finish
from .decode import RowSpec, check_context
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

    def row(self, seed: Optional[int], settings: Optional[SamplerSettings] = None) -> RowSpec:
        """One continuation of the prompt, with its own grammar mask."""
        explain = self.constraint is not None and self.constraint.explain
        mask = self.compiled.mask(self.vocab_size, explain=explain) if self.compiled is not None else None
        return RowSpec(seed, settings or self.settings, self.max_tokens, mask)


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
) -> Request:
    """Check the arguments, read the constraint (a tool adds its system text), resolve the settings
    over generation_config.json, encode the prompt (user text is never control tokens) and check
    that prompt + max_tokens fit the context. or_text: plain text is an answer too, besides the
    JSON (OpenAI's tool_choice "auto"; the text cannot start with "{")."""
    check_max_tokens(max_tokens)
    constraint = Constraint.read(json_schema, tool, explain_mask, or_text)  # bad schemas fail here
    if constraint is not None and constraint.tool is not None and system is None:
        system = tool_system(constraint.tool)
    resolved, note = resolve_settings(settings, model.info.generation_config)
    check_logit_bias(resolved.logit_bias, model.config.vocab_size)  # here, before a row is queued
    ids = encode_prompt(
        tokenizer, prompt, chat=chat, system=system, thinking=thinking, raw_special_tokens=raw_special_tokens
    )
    check_context(model, len(ids), max_tokens)
    compiled = None
    if constraint is not None:
        compiled = compile_schema(tokenizer, constraint.schema, constraint.where, constraint.param, or_text)
    return Request(ids, resolved, note, max_tokens, constraint, compiled, model.config.vocab_size)


@dataclass
class RowResult:
    """What one row wrote: its text, tokens, (optionally) its Steps, and how it ended."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    finish_reason: Optional[str] = None
    stop_token: Optional[int] = None  # the end-of-turn token that stopped it, if one did

    @property
    def first_token(self) -> Optional[int]:
        """The first token drawn: an end-of-turn id when the row wrote nothing."""
        return self.tokens[0] if self.tokens else self.stop_token


class Collector:
    """Gathers the decoder's (row, Step) pairs into RowResults; `add` returns a row once it has ended."""

    def __init__(self, n: int, keep_steps: bool = False):
        self.rows = [RowResult() for _ in range(n)]
        self._texts: list[list[str]] = [[] for _ in range(n)]
        self.keep_steps = keep_steps

    def add(self, i: int, step: Step) -> Optional[RowResult]:
        row = self.rows[i]
        self._texts[i].append(step.text)
        if step.token is not None:
            row.tokens.append(step.token)
            if self.keep_steps:
                row.steps.append(step)
            return None
        row.text, row.finish_reason, row.stop_token = "".join(self._texts[i]), step.finish_reason, step.stop_token
        return row


def check_json(spec: RowSpec, row: RowResult) -> JsonResult:
    """A constrained row's parsed JSON, whether it is complete, and its finish reason."""
    return finish(spec.mask, row.text, row.tokens, row.finish_reason)


def check_max_tokens(max_tokens: int) -> None:
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise MlxinferError(f"max_tokens must be a whole number, at least 1, got {max_tokens!r}", "max_tokens")


def check_seed(seed: Optional[int]) -> None:
    if seed is not None and not _is_seed(seed):
        raise MlxinferError(f"seed must be a whole number >= 0 and below 2**63, got {seed!r}", "seed")


def _is_seed(s) -> bool:
    return isinstance(s, int) and not isinstance(s, bool) and 0 <= s < defaults.SEED_LIMIT


def seed_list(seeds: int | str | Sequence[int]) -> list[int]:
    """N (seeds 0..N-1), 'A:B' (A..B-1, like Python's range) or the seeds themselves."""
    most = defaults.MAX_SEEDS
    if isinstance(seeds, bool):
        raise MlxinferError(f"seeds must be a count, 'A:B' or a list of seeds, got {seeds!r}", "seeds")
    if isinstance(seeds, str) and ":" not in seeds and seeds.strip().isdigit():
        seeds = int(seeds)
    if isinstance(seeds, int):
        if not 1 <= seeds <= most:
            raise MlxinferError(f"seeds must be at least 1 and at most {most:,}, got {seeds}", "seeds")
        return list(range(seeds))
    if isinstance(seeds, str):
        try:
            a, b = (int(x) for x in seeds.split(":"))
        except ValueError:
            raise MlxinferError(f"seeds takes N or A:B with whole numbers, got '{seeds}'", "seeds") from None
        if a < 0 or b <= a:
            raise MlxinferError(f"seeds {seeds} is empty or reversed; use A:B with 0 <= A < B", "seeds")
        if b - a > most or b > defaults.SEED_LIMIT:
            raise MlxinferError(f"seeds {seeds}: at most {most:,} seeds, each below 2**63", "seeds")
        return list(range(a, b))
    out = list(seeds)
    if not out or not all(_is_seed(s) for s in out):
        raise MlxinferError("seeds must be whole numbers from 0 to 2**63 - 1, at least one", "seeds")
    if len(out) > most:
        raise MlxinferError(f"seeds: at most {most:,}, got {len(out):,}", "seeds")
    return out


def check_batch_size(batch_size: Optional[int]) -> int:
    if batch_size is None:
        return defaults.BATCH_SIZE
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise MlxinferError(f"batch_size must be a whole number, at least 1, got {batch_size!r}", "batch_size")
    return batch_size
