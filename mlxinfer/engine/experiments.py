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
from ..errors import check_bool
from ..settings import SamplerSettings
from ..views import Completion, SampleReport, Tally
from . import ranks
from .answers import answers, check_walk
from .decode import check_progress, prefill_and_decode
from .grouping import keyer
from .request import check_batch_size, prepare, seed_list
from .summary import exact_of, g_test, walked_counts, wilson


def tally(completions: list[Completion], key_of: Callable[[str, Optional[int]], str]) -> list[Tally]:
    """Distinct answers (grouped by `key_of`: grouping.keyer), most common first, each with its raw texts."""
    counts: Counter = Counter()
    texts: dict[str, Counter] = {}
    for c in completions:
        key = key_of(c.text, c.tokens[0] if c.tokens else None)
        counts[key] += 1
        texts.setdefault(key, Counter())[c.text] += 1
    total = len(completions)
    return [Tally(answer, k, k / total, dict(texts[answer].most_common())) for answer, k in counts.most_common()]


def check_against_exact(report: SampleReport, exact, key_of, shown_unseen: int = 10) -> None:
    """Each tally row's exact probability and the 95% interval of its share, the likeliest answers no seed
    drew (count 0), and a G-test of the whole tally against the exact distribution (summary.g_test)."""
    probs = {a.answer: a.probs[0] for a in exact.answers}
    n = len(report.completions)
    for row in report.tally:
        row.exact = exact_of(probs, row.answer, exact.mass[0].remainder)
        row.share_low, row.share_high = wilson(row.count, n)
    drawn = {row.answer for row in report.tally}
    unseen = [a for a in exact.answers if a.answer not in drawn][:shown_unseen]
    report.tally += [Tally(a.answer, 0, 0.0, {}, a.probs[0], *wilson(0, n)) for a in unseen]
    remainder = exact.mass[0].remainder
    counts, unwalked = walked_counts([(c.text, c.tokens) for c in report.completions], key_of, exact)
    test = g_test(counts, probs, remainder, n, unwalked)
    report.exact = {
        "remainder": remainder,
        "complete": exact.mass[0].complete,
        "stopped": exact.stopped,
        "nodes": exact.nodes,
        "answers": len(exact.answers),
        **test,
    }


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
    group: str = defaults.ANSWER_GROUP,
    exact: bool = False,
    min_mass: float = defaults.EXACT_MIN_MASS,
    max_nodes: int = defaults.EXACT_MAX_NODES,
    max_seconds: Optional[float] = None,
) -> SampleReport:
    """One completion per seed, then a tally of the distinct answers.

    seeds: N (0..N-1), 'A:B', or a list. settings: a SamplerSettings, a dict of the fields you
    set (the rest from generation_config.json), or None. batch_size: rows per forward pass
    (default 32; 1 runs the seeds one at a time). json_schema / tool: every row writes JSON of
    that shape through its own grammar mask; each completion says whether it came out complete.
    raw_special_tokens: see encode_prompt. stop: a string or strings where each completion ends.
    group: which completions count as one answer in the tally (grouping.py: first-word, text, first-token).
    exact: also walk the answers' exact distribution under the same settings (answers.py, to min_mass or
    max_nodes) and set each tally row's exact probability beside its count, with a G-test of the tally.
    Ctrl-C (KeyboardInterrupt) during the draws returns the seeds that finished, as the CLI prints them:
    the report's `interrupted` says how many ("5 of 20 seeds finished"); None when every seed ran.
    """
    check_bool(exact, "exact")  # before the draws: exact="no" would walk after them
    check_walk(min_mass, max_nodes, group, max_seconds)  # also where exact is off: a bad value is never ignored
    check_progress(progress)
    key_of = keyer(group, lambda t: tokenizer.decode([t]))
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
    ranks.agree({**ranks.request_fields(model, request), "seeds": seed_ids, "group": group,
                 "walk": [exact, min_mass, max_nodes, max_seconds], "batch_size": size}, ranks.group())  # fmt: skip
    seed_ranks = ranks.seed_group(model)
    mine = ranks.share(seed_ids, seed_ranks)  # under mlx.launch each rank draws every N-th seed (all: a split model)
    specs = [request.row(seed) for seed in mine]
    completions: list[Optional[Completion]] = [None] * len(specs)
    done = 0
    steps = (
        prefill_and_decode(model, tokenizer, request.ids, specs, batch_size=size, step_logprobs=False) if specs else []
    )
    interrupted = False
    try:
        for live, step in steps:  # a rank with no seed of its own (fewer seeds than ranks) draws nothing
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
    except KeyboardInterrupt:  # the seeds that finished are draws as good as any: kept, the report says so
        if seed_ranks.size() > 1:
            raise
        interrupted, completions = True, [c for c in completions if c is not None]
    if seed_ranks.size() > 1:
        gathered = ranks.gather([c.to_dict() for c in completions], seed_ranks)
        everything = {c["seed"]: Completion(**c) for c in gathered}
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
        weights=model.info.weights,
    )
    report.group, report.max_tokens, report.stop = group, max_tokens, list(request.stop)
    report.tally = tally(report.completions, key_of)
    if interrupted:
        report.interrupted = f"{done:,} of {len(seed_ids):,} seeds finished"
        return report  # no walk after Ctrl-C
    if exact:
        options = dict(chat=chat, system=system, thinking=thinking, raw_special_tokens=raw_special_tokens)
        walk = answers(
            model, tokenizer, prompt, settings=[request.settings], max_tokens=max_tokens, stop=stop,
            min_mass=min_mass, max_nodes=max_nodes, max_seconds=max_seconds, batch_size=size, group=group,
            json_schema=json_schema,
            tool=tool, **options,
        )  # fmt: skip
        if walk.stopped == "interrupted":  # Ctrl-C stops the command, as during the draws: no partial figures
            raise KeyboardInterrupt
        check_against_exact(report, walk, key_of)
    return report
