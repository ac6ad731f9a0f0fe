"""Seeded sampling experiments: the lesson's ten draws, as many as you like.

The prompt is prefilled once; the seeds continue from it `batch_size` rows per forward pass,
each row drawing from its own seed's key chain (see decode.py). Each seed's completion is
what `generate(..., seed=s)` gives, and what mlx-lm gives after `mx.random.seed(s)`, exactly
where the forward pass gives a row the same bits alone or in a batch (the weights as stored,
on MLX's CPU back end); on the float32 BLAS path a batched row can differ in the last bits,
which can flip a near tie (batch_size=1 runs the seeds one at a time).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Mapping, Optional, Sequence

from .. import defaults
from ..settings import SamplerSettings
from ..views import Completion, SampleReport, Tally
from . import ranks
from .decode import prefill_and_decode
from .request import check_batch_size, prepare, seed_list


def tally(completions: list[Completion]) -> list[Tally]:
    """Distinct answers (stripped of surrounding space), most common first."""
    counts = Counter(c.text.strip() for c in completions)
    total = len(completions)
    return [Tally(answer, k, k / total) for answer, k in counts.most_common()]


def sample(
    model,
    tokenizer,
    prompt: str | list[int],
    *,
    seeds: int | str | Sequence[int],
    settings: SamplerSettings | Mapping[str, Any] | None = None,
    max_tokens: int = defaults.MAX_TOKENS_SAMPLE,
    batch_size: Optional[int] = None,
    chat: bool = True,
    system: Optional[str] = None,
    thinking: bool = False,
    json_schema: dict | str | None = None,
    tool: dict | str | None = None,
    progress: Optional[Callable[[int, int], None]] = None,
    raw_special_tokens: bool = False,
    stop: str | Sequence[str] | None = None,
) -> SampleReport:
    """One completion per seed, then a tally of the distinct answers.

    seeds: N (0..N-1), 'A:B', or a list. settings: a SamplerSettings, a dict of the fields you
    set (the rest from generation_config.json), or None. batch_size: rows per forward pass
    (default 32; 1 runs the seeds one at a time). json_schema / tool: every row writes JSON of
    that shape through its own grammar mask; each completion says whether it came out complete.
    raw_special_tokens: see encode_prompt. stop: a string or strings where each completion ends.
    """
    seed_ids = seed_list(seeds)
    size = check_batch_size(batch_size)
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
        stop=stop,
    )
    group = ranks.seed_group(model)
    mine = ranks.share(seed_ids, group)  # under mlx.launch each rank draws every N-th seed (all: a split model)
    specs = [request.row(seed) for seed in mine]
    completions: list[Optional[Completion]] = [None] * len(specs)
    done = 0
    for live, step in prefill_and_decode(model, tokenizer, request.ids, specs, batch_size=size, step_logprobs=False):
        if step.token is not None:
            continue
        i, row = live.index, live.result
        completions[i] = Completion(mine[i], row.text, row.tokens, row.finish_reason)
        if request.constraint is not None:
            checked = live.json()
            completions[i].valid, completions[i].parsed = checked.valid, checked.parsed
            completions[i].finish_reason = checked.finish_reason
        done += 1
        if progress:
            progress(done, len(specs))
    if group.size() > 1:
        everything = {c["seed"]: Completion(**c) for c in ranks.gather([c.to_dict() for c in completions], group)}
        completions = [everything[seed] for seed in seed_ids]
    report = SampleReport(
        model.info.name,
        prompt if isinstance(prompt, str) else "",
        request.ids,
        request.settings.to_dict(),
        request.note,
        completions,
        batch_size=size,
        definition=model.info.definition,
        sharding=model.info.sharding,
    )
    report.tally = tally(report.completions)
    return report
