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

from ..errors import MlxinferError
from ..settings import SamplerSettings, resolve_settings
from ..tokenizer import encode_prompt
from ..views import Completion, SampleReport, Stats, Tally
from . import ranks
from .decode import RowSpec, check_context, check_max_tokens, run
from .constrain import finish
from .schema import Constraint, tool_system

DEFAULT_BATCH = 32
MAX_SEEDS = 100_000  # a list of seeds is built before the first draw: bound it


def seed_list(seeds: int | str | Sequence[int]) -> list[int]:
    """N (seeds 0..N-1), 'A:B' (A..B-1, like Python's range) or the seeds themselves."""
    if isinstance(seeds, bool):
        raise MlxinferError(f"seeds must be a count, 'A:B' or a list of seeds, got {seeds!r}", "seeds")
    if isinstance(seeds, int):
        if not 1 <= seeds <= MAX_SEEDS:
            raise MlxinferError(f"seeds must be at least 1 and at most {MAX_SEEDS:,}, got {seeds}", "seeds")
        return list(range(seeds))
    if isinstance(seeds, str):
        try:
            a, b = (int(x) for x in seeds.split(":"))
        except ValueError:
            raise MlxinferError(f"seeds takes A:B with whole numbers, got '{seeds}'", "seeds") from None
        if a < 0 or b <= a:
            raise MlxinferError(f"seeds {seeds} is empty or reversed; use A:B with 0 <= A < B", "seeds")
        if b - a > MAX_SEEDS or b > 2**63:
            raise MlxinferError(f"seeds {seeds}: at most {MAX_SEEDS:,} seeds, each below 2**63", "seeds")
        return list(range(a, b))
    out = list(seeds)
    if not out or any(isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < 2**63 for s in out):
        raise MlxinferError("seeds must be whole numbers from 0 to 2**63 - 1, at least one", "seeds")
    if len(out) > MAX_SEEDS:
        raise MlxinferError(f"seeds: at most {MAX_SEEDS:,}, got {len(out):,}", "seeds")
    return out


def check_batch_size(batch_size: Optional[int]) -> int:
    if batch_size is None:
        return DEFAULT_BATCH
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise MlxinferError(f"batch_size must be a whole number, at least 1, got {batch_size!r}", "batch_size")
    return batch_size


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
    max_tokens: int = 5,
    batch_size: Optional[int] = None,
    chat: bool = True,
    system: Optional[str] = None,
    thinking: bool = False,
    json_schema: dict | str | None = None,
    tool: dict | str | None = None,
    progress: Optional[Callable[[int, int], None]] = None,
    raw_special_tokens: bool = False,
) -> SampleReport:
    """One completion per seed, then a tally of the distinct answers.

    seeds: N (0..N-1), 'A:B', or a list. settings: a SamplerSettings, a dict of the fields you
    set (the rest from generation_config.json), or None. batch_size: rows per forward pass
    (default 32; 1 runs the seeds one at a time). json_schema / tool: every row writes JSON of
    that shape through its own grammar mask; each completion says whether it came out complete.
    raw_special_tokens: see encode_prompt.
    """
    seed_ids = seed_list(seeds)
    check_max_tokens(max_tokens)
    size = check_batch_size(batch_size)
    constraint = Constraint.read(json_schema, tool)
    if constraint is not None and constraint.tool is not None and system is None:
        system = tool_system(constraint.tool)
    resolved, note = resolve_settings(settings, model.info.generation_config)
    ids = encode_prompt(
        tokenizer, prompt, chat=chat, system=system, thinking=thinking, raw_special_tokens=raw_special_tokens
    )
    check_context(model, len(ids), max_tokens)
    group = ranks.seed_group(model)
    mine = ranks.share(seed_ids, group)  # under mlx.launch each rank draws every N-th seed (all: a split model)
    vocab = model.config.vocab_size
    specs = [RowSpec(seed, resolved, max_tokens, constraint and constraint.mask(tokenizer, vocab)) for seed in mine]
    texts: list[list[str]] = [[] for _ in specs]
    tokens: list[list[int]] = [[] for _ in specs]
    completions: list[Optional[Completion]] = [None] * len(specs)
    done = 0
    for i, step in run(model, tokenizer, ids, specs, batch_size=size, step_logprobs=False, stats=Stats()):
        texts[i].append(step.text)
        if step.token is not None:
            tokens[i].append(step.token)
            continue
        completions[i] = Completion(mine[i], "".join(texts[i]), tokens[i], step.finish_reason)
        if constraint is not None:
            checked = finish(specs[i].mask, completions[i].text, tokens[i], step.finish_reason)
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
        ids,
        resolved.to_dict(),
        note,
        completions,
        batch_size=size,
        definition=model.info.definition,
        sharding=model.info.sharding,
    )
    report.tally = tally(report.completions)
    return report
