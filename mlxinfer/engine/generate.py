"""`generate` and `stream_generate`: text from one prompt, as mlx-lm's functions of those names.

Both take the prompt as text (wrapped in the chat template unless chat=False) or as token ids,
and `settings` as a SamplerSettings, a dict of the fields you set (the rest from the model's
generation_config.json, as the CLI does), or None (generation_config.json alone). With
`json_schema` or `tool` a grammar mask keeps the output to compact JSON of the schema's shape;
the result says whether it came out complete (`valid`) and what it parsed to.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Iterator, Mapping, Optional, Sequence

from .. import defaults
from ..errors import MlxinferError, check_whole
from ..settings import SamplerSettings
from ..views import Generation, Stats, Step
from . import ranks
from .core import RowResult
from .decode import prefill_and_decode
from .request import Request, check_pair, check_seed, prepare


class GenerationStream:
    """Iterate for the Steps as they are decoded; the last has token None and the finish reason.
    Once the iteration ends, `result` holds the whole Generation (text, stats, JSON check)."""

    def __init__(self, model, tokenizer, request: Request, seed: Optional[int], logprobs: int):
        self.model, self.tokenizer, self.request, self.logprobs = model, tokenizer, request, logprobs
        self.spec = request.row(seed)
        self.note = request.note
        self.stats = Stats()
        self._result: Optional[Generation] = None
        self._row = None  # the row in flight, once the prefill has run
        self._steps = None  # prefill_and_decode's generator, once iterated
        self._yielded = 0  # steps with a token handed out
        self.started = False

    @property
    def seed(self) -> Optional[int]:
        """The seed the draws come from; None where greedy (temperature 0 draws nothing: no seed to keep) or where
        they come from MLX's global stream."""
        return None if self.spec.settings.greedy else self.spec.seed

    @property
    def result(self) -> Generation:
        """The whole Generation, once the iteration has ended (was: None, then an AttributeError on it)."""
        if self._result is None:
            how = "iterate it to its end first" if not self.started else "it stopped before its end"
            raise MlxinferError(f"this stream has no result yet: {how} (generate() does it in one call)", "stream")
        return self._result

    def __iter__(self) -> Iterator[Step]:
        if self.started:  # a second pass would decode again into the same stats and grammar state
            raise MlxinferError(
                "this stream was already iterated; call stream_generate again for another generation", "stream"
            )
        self.started = True
        model, request, spec = self.model, self.request, self.spec
        steps = self._steps = prefill_and_decode(
            model, self.tokenizer, request.ids, [spec], logprobs=self.logprobs, stats=self.stats, keep_steps=True
        )
        for live, step in steps:
            self._row = live
            if step.token is not None:
                if self.logprobs:
                    step.token_text = self.tokenizer.decode([step.token])
                self._yielded += 1
                yield step
                continue
            result = self._generation(live.result.finish_reason)
            if request.constraint is not None:
                self._check_json(result, live)
                step.finish_reason = self.stats.finish_reason = result.finish_reason
            self._result = result
            yield step

    def stop(self) -> Generation:
        """End the stream part-way (Ctrl-C between two steps): `result` holds the steps handed out so far, their
        text and tokens, finish_reason 'interrupted' (as a chat reply stopped part-way). Call it from the thread
        that iterates the stream (a KeyboardInterrupt handler); once the stream has ended, its result as it is."""
        if self._result is None:
            if self._steps is not None:
                try:
                    self._steps.close()  # its stats: the time and speed so far
                except ValueError:  # "generator already executing": called from another thread; stats as they are
                    pass
            self.stats.finish_reason = "interrupted"
            self.stats.generated_tokens = self._yielded
            self._result = self._generation("interrupted")
        return self._result

    def _generation(self, finish_reason: Optional[str]) -> Generation:
        row = self._row.result if self._row is not None else RowResult()
        text, tokens, steps = row.text, row.tokens, row.steps
        if finish_reason == "interrupted":  # what was handed out: a token the row took as Ctrl-C came was never shown
            steps = steps[: self._yielded]
            text, tokens = "".join(s.text for s in steps), [s.token for s in steps]
        return Generation(
            self.model.info.name, self.request.ids, text, tokens, steps, self.stats,
            self.spec.settings.to_dict(), self.note, self.seed, finish_reason,
            definition=self.model.info.definition, sharding=self.model.info.sharding,
        )  # fmt: skip

    def _check_json(self, result: Generation, row) -> None:
        checked, mask, compiled = row.json(), self.spec.mask, self.request.compiled
        result.parsed, result.valid, result.warning = checked.parsed, checked.valid, checked.warning
        result.finish_reason = checked.finish_reason
        tool = self.request.constraint.tool
        result.tool = tool["name"] if tool is not None else None
        result.grammar_seconds = {
            "token_table": compiled.table.build_seconds,
            "compile": compiled.compile_seconds,
            "mask_per_step": mask.mask_seconds,
            "wait_per_step": mask.wait_seconds,
        }
        if self.request.constraint.explain:
            result.mask_steps = [s.to_dict() for s in mask.explained()]


def stream_generate(
    model,
    tokenizer,
    prompt: str | list[int],
    *,
    settings: SamplerSettings | Mapping[str, Any] | None = None,
    max_tokens: int = defaults.MAX_TOKENS_GENERATE,
    seed: Optional[int] = None,
    json_schema: dict | str | None = None,
    tool: dict | str | None = None,
    logprobs: int = 0,
    chat: bool = True,
    system: Optional[str] = None,
    thinking: bool = False,
    explain_mask: bool = False,
    raw_special_tokens: bool = False,
    stop: str | Sequence[str] | None = None,
) -> GenerationStream:
    """Check every argument (one MlxinferError naming the parameter), then return the stream.

    seed: draws from `mx.random.key(seed)`'s chain, which is what mlx-lm draws after
    `mx.random.seed(seed)`; None draws from MLX's global stream. json_schema: a JSON Schema
    whose top level is an object; tool: a tool definition in Anthropic's format (name,
    description, input_schema); either as a dict, inline JSON text or a file path. raw_special_tokens:
    special tokens' names in the prompt and system text are control tokens, not text (see encode_prompt).
    stop: a string or strings where the text ends (returned up to the first, finish_reason "stop"; a
    stream holds text back only while it could still be the start of one).
    """
    check_pair(model, tokenizer)
    check_whole(logprobs, "logprobs", 0, "a whole number >= 0")
    check_seed(seed)
    if logprobs > model.config.vocab_size:
        raise MlxinferError(
            f"logprobs must be at most the vocabulary size {model.config.vocab_size:,}, got {logprobs:,}", "logprobs"
        )
    request = prepare(
        model,
        tokenizer,
        prompt,
        settings=settings,
        max_tokens=max_tokens,
        json_schema=json_schema,
        tool=tool,
        chat=chat,
        system=system,
        thinking=thinking,
        raw_special_tokens=raw_special_tokens,
        explain_mask=explain_mask,
        stop=stop,
    )
    if model.info.sharding:  # every rank takes part in every forward pass: they must be running the same generation
        ranks.agree({**ranks.request_fields(model, request), "seed": seed, "logprobs": logprobs}, ranks.group())
    return GenerationStream(model, tokenizer, request, seed, logprobs)


def generate(model, tokenizer, prompt: str | list[int], **kwargs) -> Generation:
    """The whole generation at once: text, tokens, steps, stats, finish reason, and with json_schema
    or tool the parsed JSON and whether it is valid. Takes stream_generate's keywords."""
    for name in kwargs:
        if name not in _KEYWORDS:
            field = "temperature" if name == "temp" else name  # mlx-lm's old spelling
            hint = f"; a sampler setting goes in settings={{{field!r}: ...}}" if field in _SETTING_NAMES else ""
            raise TypeError(f"generate() got an unexpected keyword argument {name!r}{_MLX_LM.get(name, hint)}")
    stream = stream_generate(model, tokenizer, prompt, **kwargs)
    for _ in stream:
        pass
    return stream.result


_KEYWORDS = frozenset(inspect.signature(stream_generate).parameters) - {"model", "tokenizer", "prompt"}
_MLX_LM = {  # mlx-lm's generate() keywords, and what takes their place here
    "sampler": "; the sampler is settings=SamplerSettings(...) or a dict of its fields (make_sampler(settings) "
    "gives mlx-lm one)",
    "logits_processors": "; penalties and a logit bias are settings fields, a grammar is json_schema= or tool=",
    "verbose": "; the text and its speed come back as data: result.text, result.stats",
    "max_kv_size": "; the cache holds the whole context",
}
# help(generate) and Jupyter's signature pop-up list stream_generate's keywords, which generate takes
generate.__signature__ = inspect.signature(stream_generate).replace(return_annotation=Generation)
_SETTING_NAMES = frozenset(f.name for f in dataclasses.fields(SamplerSettings))
