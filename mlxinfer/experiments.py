"""Seeded sampling experiments: the lesson's ten draws, as many as you like.

The prompt is prefilled once; every seed continues from a copy of that KV cache,
so a sweep costs one prefill plus the decode steps. Each seed's completion is
exactly what `generate --seed s` (and mlx-lm after `mx.random.seed(s)`) gives.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional, Sequence

import mlx.core as mx

from .errors import MlxinferError
from .generate import Stats, generate_steps, prefill
from .sampler import SamplerSettings, make_logits_processors, make_sampler
from .tables import check_context
from .tokenizer import encode_prompt


@dataclass
class Completion:
    seed: int
    text: str
    tokens: list[int]
    finish_reason: str


@dataclass
class Tally:
    answer: str
    count: int
    share: float


@dataclass
class SampleReport:
    model: str
    prompt: str
    prompt_ids: list[int]
    settings: dict
    settings_note: str
    completions: list[Completion] = field(default_factory=list)
    tally: list[Tally] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def parse_seeds(seeds: Optional[int] = None, seed_range: Optional[str] = None) -> list[int]:
    """`--seeds N` is 0..N-1; `--seed-range A:B` is A..B-1, like Python's range."""
    if (seeds is None) == (seed_range is None):
        raise MlxinferError("give exactly one of --seeds N or --seed-range A:B")
    if seeds is not None:
        if seeds < 1:
            raise MlxinferError(f"--seeds must be at least 1, got {seeds}")
        return list(range(seeds))
    try:
        a, b = (int(x) for x in seed_range.split(":"))
    except ValueError:
        raise MlxinferError(f"--seed-range takes A:B with whole numbers, got '{seed_range}'") from None
    if a < 0 or b <= a:
        raise MlxinferError(f"--seed-range {seed_range} is empty or reversed; use A:B with 0 <= A < B")
    return list(range(a, b))


def sample_seeds(
    model,
    tokenizer,
    prompt: str,
    seeds: Sequence[int],
    settings: SamplerSettings,
    *,
    max_tokens: int = 5,
    chat: bool = True,
    thinking: bool = False,
    system: Optional[str] = None,
    settings_note: str = "",
    progress: Optional[Callable[[int, int], None]] = None,
) -> SampleReport:
    settings.validate()
    if max_tokens < 1:
        raise MlxinferError(f"--max-tokens must be at least 1, got {max_tokens}")
    ids = encode_prompt(tokenizer, prompt, chat=chat, system=system, thinking=thinking)
    check_context(model, len(ids), extra=max_tokens)
    shared = model.make_cache()
    prefill(model, ids[:-1], shared)  # once for every seed
    report = SampleReport(
        getattr(getattr(model, "source", None), "name", ""), prompt, ids, settings.to_dict(), settings_note
    )
    for n, seed in enumerate(seeds):
        mx.random.seed(seed)
        stats = Stats()
        steps = list(
            generate_steps(
                model,
                tokenizer,
                ids,
                make_sampler(settings),
                max_tokens=max_tokens,
                processors=make_logits_processors(settings),
                stats=stats,
                cache=[c.copy() for c in shared],
            )
        )
        tokens = [s.token for s in steps if s.token >= 0]
        report.completions.append(Completion(seed, "".join(s.text for s in steps), tokens, stats.finish_reason))
        if progress:
            progress(n + 1, len(seeds))
    counts = Counter(c.text.strip() for c in report.completions)
    total = len(report.completions)
    report.tally = [Tally(answer, k, k / total) for answer, k in counts.most_common()]
    return report
