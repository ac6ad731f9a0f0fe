"""`generate` and `stream_generate`: text from one prompt, as mlx-lm's functions of those names.

Both take the prompt as text (wrapped in the chat template unless chat=False) or as token ids,
and `settings` as a SamplerSettings, a dict of the fields you set (the rest from the model's
generation_config.json, as the CLI does), or None (generation_config.json alone). With
`json_schema` or `tool` a grammar mask keeps the output to compact JSON of the schema's shape;
the result says whether it came out complete (`valid`) and what it parsed to.
"""

from __future__ import annotations

from typing import Any, Iterator, Mapping, Optional

from ..errors import MlxinferError
from ..settings import SamplerSettings, resolve_settings
from ..tokenizer import encode_prompt
from ..views import Generation, Stats, Step
from .decode import RowSpec, check_context, check_max_tokens, run
from .schema import Constraint, tool_system


class GenerationStream:
    """Iterate for the Steps as they are decoded; the last has token None and the finish reason.
    Once the iteration ends, `result` holds the whole Generation (text, stats, JSON check)."""

    def __init__(
        self,
        model,
        tokenizer,
        ids: list[int],
        spec: RowSpec,
        *,
        logprobs: int,
        note: str,
        constraint: Optional[Constraint],
    ):
        self.model, self.tokenizer, self.ids, self.spec = model, tokenizer, ids, spec
        self.logprobs, self.note, self.constraint = logprobs, note, constraint
        self.stats = Stats()
        self.result: Optional[Generation] = None

    def __iter__(self) -> Iterator[Step]:
        steps: list[Step] = []
        text = []
        for _, step in run(self.model, self.tokenizer, self.ids, [self.spec], logprobs=self.logprobs, stats=self.stats):
            text.append(step.text)
            if step.token is not None:
                steps.append(step)
                yield step
                continue
            result = Generation(
                self.model.info.name,
                self.ids,
                "".join(text),
                [s.token for s in steps],
                steps,
                self.stats,
                self.spec.settings.to_dict(),
                self.note,
                self.spec.seed,
                step.finish_reason,
                definition=self.model.info.definition,
                sharding=self.model.info.sharding,
            )
            if self.constraint is not None:
                self.constraint.check(result, self.spec.mask)
                step.finish_reason = self.stats.finish_reason = result.finish_reason
            self.result = result
            yield step


def stream_generate(
    model,
    tokenizer,
    prompt: str | list[int],
    *,
    settings: SamplerSettings | Mapping[str, Any] | None = None,
    max_tokens: int = 256,
    seed: Optional[int] = None,
    json_schema: dict | str | None = None,
    tool: dict | str | None = None,
    logprobs: int = 0,
    chat: bool = True,
    system: Optional[str] = None,
    thinking: bool = False,
    explain_mask: bool = False,
    raw_special_tokens: bool = False,
) -> GenerationStream:
    """Check every argument (one MlxinferError naming the parameter), then return the stream.

    seed: draws from `mx.random.key(seed)`'s chain, which is what mlx-lm draws after
    `mx.random.seed(seed)`; None draws from MLX's global stream. json_schema: a JSON Schema
    whose top level is an object; tool: a tool definition in Anthropic's format (name,
    description, input_schema); either as a dict, inline JSON text or a file path. raw_special_tokens:
    special tokens' names in the prompt and system text are control tokens, not text (see encode_prompt).
    """
    check_max_tokens(max_tokens)
    if isinstance(logprobs, bool) or not isinstance(logprobs, int) or logprobs < 0:
        raise MlxinferError(f"logprobs must be a whole number >= 0, got {logprobs!r}", "logprobs")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63):
        raise MlxinferError(f"seed must be a whole number >= 0, got {seed!r}", "seed")
    constraint = Constraint.read(json_schema, tool, explain_mask)  # bad schemas fail here
    if constraint is not None and constraint.tool is not None and system is None:
        system = tool_system(constraint.tool)
    resolved, note = resolve_settings(settings, model.info.generation_config)
    if logprobs > model.config.vocab_size:
        raise MlxinferError(
            f"logprobs must be at most the vocabulary size {model.config.vocab_size:,}, got {logprobs:,}", "logprobs"
        )
    ids = encode_prompt(
        tokenizer, prompt, chat=chat, system=system, thinking=thinking, raw_special_tokens=raw_special_tokens
    )
    check_context(model, len(ids), max_tokens)
    mask = constraint.mask(tokenizer, model.config.vocab_size) if constraint is not None else None
    return GenerationStream(
        model,
        tokenizer,
        ids,
        RowSpec(seed, resolved, max_tokens, mask),
        logprobs=logprobs,
        note=note,
        constraint=constraint,
    )


def generate(
    model,
    tokenizer,
    prompt: str | list[int],
    *,
    settings: SamplerSettings | Mapping[str, Any] | None = None,
    max_tokens: int = 256,
    seed: Optional[int] = None,
    json_schema: dict | str | None = None,
    tool: dict | str | None = None,
    logprobs: int = 0,
    chat: bool = True,
    system: Optional[str] = None,
    thinking: bool = False,
    explain_mask: bool = False,
    raw_special_tokens: bool = False,
) -> Generation:
    """The whole generation at once: text, tokens, steps, stats, finish reason, and with json_schema
    or tool the parsed JSON and whether it is valid. The arguments are stream_generate's."""
    stream = stream_generate(
        model,
        tokenizer,
        prompt,
        settings=settings,
        max_tokens=max_tokens,
        seed=seed,
        json_schema=json_schema,
        tool=tool,
        logprobs=logprobs,
        chat=chat,
        system=system,
        thinking=thinking,
        explain_mask=explain_mask,
        raw_special_tokens=raw_special_tokens,
    )
    for _ in stream:
        pass
    return stream.result
