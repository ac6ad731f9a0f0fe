"""`sweep`: a seeded experiment over a grid of prompts x sampler settings x seeds.

Each prompt is prefilled once; each (prompt, settings) cell's seeds continue from it `batch_size`
rows per forward pass (decode.py), and every completion becomes one record: the same text
`sample` gives for that seed. Records go to a JSON Lines file as each batch finishes
(results.py), so a long experiment can be interrupted and resumed. The summary (summary.py)
sets each answer's share beside the model's probability of its first token.

Under `mlx.launch` (MLX's own distributed layer: ring over TCP, MPI, JACCL) each rank takes a
deterministic share of every cell's seeds (the k-th seed of a cell goes to rank k mod N), keeps
its own part file for resuming, and rank 0 gathers the records over `mx.distributed` into the one
results file and summary. One process or N give the same completions where a row's draws do not
depend on its batch (the weights as stored, on the CPU; see experiments.py). When the model is
split across the ranks instead (`load(..., group=...)`), every rank runs every seed in step and
rank 0 alone keeps the results file.
"""

from __future__ import annotations

from contextlib import contextmanager

import hashlib
import itertools
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import mlx.core as mx

from .. import defaults
from ..errors import MlxinferError, check_bool, check_listed_once, shown
from ..sampler import kept_probabilities
from ..settings import GRID_FIELDS, SamplerSettings, resolve_each, settings_list
from ..views import SweepRecord, SweepReport
from . import ranks as rank_group
from . import results
from .schema import _one_line
from .core import RowSpec, replay
from .decode import Prefilled, check_progress, decode, prefill
from .answers import answers, check_walk
from .grouping import keyer
from .prompt_list import PromptsFile, check_prompts_once, prompt_list
from .request import check_batch_size, prepare, seed_list, stop_strings
from .summary import exact_of, summarize


def _param(axis: str) -> str:
    """The parameter an axis is given by: settings_grid's `temperatures`, else the setting's own name."""
    return "temperatures" if axis == "temperature" else axis


def settings_grid(temperatures: Sequence[float] | None = None, **axes: Sequence | None) -> list[dict]:
    """Every combination of the values given, one axis per sampler setting sweep can cross
    (settings.GRID_FIELDS: temperature, top_p, top_k, min_p, ...); a setting left None is not set
    (generation_config.json's). `temperatures` is the temperature axis."""
    unknown = sorted(set(axes) - set(GRID_FIELDS))
    if unknown:
        raise MlxinferError(f"settings_grid has no axis {unknown[0]!r}; its axes: {', '.join(GRID_FIELDS)}", unknown[0])
    given = {"temperature": temperatures, **axes}
    named = [(name, _axis(name, given[name])) for name in GRID_FIELDS if given.get(name) is not None]
    empty = [name for name, values in named if not values]
    if empty:
        param = _param(empty[0])
        raise MlxinferError(f"{param} is empty, so the grid has no cells; give at least one value", param)
    cells = math.prod(len(v) for _, v in named)
    if cells > defaults.MAX_GRID_CELLS:  # counted before the grid is built: a product of long axes never ends
        sizes = " x ".join(f"{len(v):,} {_param(n)}" for n, v in named)
        raise MlxinferError(
            f"the grid would have {cells:,} settings cells ({sizes}); at most {defaults.MAX_GRID_CELLS:,}: "
            "give fewer values",
            *[_param(n) for n, _ in named],
        )
    return [dict(zip([n for n, _ in named], combo)) for combo in itertools.product(*[v for _, v in named])]


def _axis(name: str, values) -> list:
    """An axis's values: a list of them, or one number (an axis of one value)."""
    param = _param(name)
    if isinstance(values, (int, float)) and not isinstance(values, bool):
        values = [values]
    elif isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise MlxinferError(f"{param} must be a list of values (e.g. [0.5, 1.0]), got {values!r:.60}", param)
    values = list(values)
    rule = next(o for o in SamplerSettings.options() if o.name == name)
    read = [getattr(SamplerSettings(**{name: v}), name) for v in values]  # as a cell reads them: top_k -1 is 0
    bad = [v for v, r in zip(values, read) if not rule.ok(r)]
    if bad:  # here, where the grid is built, not at the cell that would run it
        raise MlxinferError(f"{param} must be {rule.must_be}, got {shown(bad[0], rule.kind)}", param)
    check_listed_once(read, param)
    return values


def first_token_probs(prefilled: Prefilled, settings: SamplerSettings, fast: bool = False) -> mx.array:
    """(V,) each token's probability as the first draw under `settings`: adjusted, tempered, cut, rescaled
    (fast: as the model's CPU kernels cut its draws)."""
    return kept_probabilities(prefilled.logits.reshape(-1), settings, history=prefilled.ids, fast=fast)[3]


@dataclass
class _Plan:
    """The experiment: each prompt's ids, text and hash, the resolved settings, the seeds, the header."""

    ids: list[list[int]]
    texts: list[str]
    hashes: list[str]
    settings: list[SamplerSettings]
    seeds: list[int]
    max_tokens: int
    header: dict
    stop: tuple[str, ...] = ()
    after: list[tuple[int, ...]] = field(default_factory=list)  # each prompt's Request.after


def _plan(model, tokenizer, prompts, settings, seeds, max_tokens, chat, system, thinking, raw, stop) -> _Plan:
    given = prompts
    prompts = prompt_list(prompts)
    lines = given.lines if isinstance(given, PromptsFile) and len(given.lines) == len(prompts) else None
    check_prompts_once(prompts, lines, given)
    settings = settings_list(settings, "settings_grid([0.5, 1.0])")
    seed_ids = seed_list(seeds)
    draws = len(prompts) * len(settings) * len(seed_ids)
    if draws > defaults.MAX_SWEEP_DRAWS:  # each is a pending draw, listed before the first
        raise MlxinferError(
            f"the sweep would draw {draws:,} completions ({len(prompts):,} prompts x {len(settings):,} settings x "
            f"{len(seed_ids):,} seeds); at most {defaults.MAX_SWEEP_DRAWS:,} a run: split it into runs with an out "
            "file each",
            "seeds",
        )
    stops = stop_strings(stop)
    options = dict(max_tokens=max_tokens, chat=chat, system=system, thinking=thinking, raw_special_tokens=raw)
    ids, after = [], []
    for n, p in enumerate(prompts, start=1):
        try:
            request = prepare(model, tokenizer, p, **options)
            ids.append(request.ids)
            after.append(request.after)
        except MlxinferError as e:  # which of the prompts: a prompts file's line, or the nth of the list
            if lines is not None:  # the file names it; "prompt" would name -p, which gave none of them
                params = ("prompts_file", *(q for q in e.params if q != "prompt"))
                raise MlxinferError(f"prompts_file {given.path} line {lines[n - 1]}: {e}", *params) from None
            if len(prompts) == 1:
                raise
            head = _one_line(p, 43) if isinstance(p, str) else "token ids"
            # after the message: a front end swaps the first mention of a parameter for its flag
            raise MlxinferError(f"{e} (#{n} of the {len(prompts)} prompts: {head!r})", *e.params) from None
    resolved = resolve_each(settings, model.info.generation_config)
    texts = [p if isinstance(p, str) else tokenizer.decode(p) for p in prompts]
    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in ids]
    header = {
        "model": rank_group.identity(model),  # a resume with another model is refused
        "prompts": texts,
        "prompt_sha256": hashes,
        "settings": [s.to_dict() for s in resolved],
        "max_tokens": max_tokens,
        "chat": chat,
        "system": system,
        "thinking": thinking,
    }
    if stops:  # only when given, so that files written before stop strings existed still resume
        header["stop"] = list(stops)
    if any(after):  # a plain prompt's texts keep their first space (core.continues); a file without the
        header["continues"] = True  # field was written before, and a resumed run keeps its texts' rule
    return _Plan(ids, texts, hashes, resolved, seed_ids, max_tokens, header, stops, after)


def sweep(
    model,
    tokenizer,
    prompts: Sequence[str | list[int]],
    *,
    settings: Sequence[SamplerSettings | Mapping[str, Any]],
    seeds: int | str | Sequence[int],
    max_tokens: int = defaults.MAX_TOKENS_SAMPLE,
    batch_size: Optional[int] = None,
    chat: bool = True,
    system: Optional[str] = None,
    thinking: bool = False,
    raw_special_tokens: bool = False,
    out: str | Path | None = None,
    resume: bool = False,
    progress: Optional[Callable[[int, int], None]] = None,
    stop: str | Sequence[str] | None = None,
    group: str = defaults.ANSWER_GROUP,
    exact: bool = False,
    min_mass: float = defaults.EXACT_MIN_MASS,
    max_nodes: int = defaults.EXACT_MAX_NODES,
    max_seconds: Optional[float] = None,
) -> SweepReport:
    """Every prompt x every settings entry x every seed: one completion each, and the summary per cell.

    settings: each a SamplerSettings or a dict of the fields set (the rest from generation_config.json);
    `settings_grid` builds the product of value lists. out: a .jsonl results file, appended per batch;
    resume=True skips the completions it already holds (it must be the same experiment).
    raw_special_tokens: see encode_prompt. stop: a string or strings where each completion ends.
    group: which completions count as one answer in each cell's summary (grouping.py). exact: each cell's
    exact answer distribution too (answers.py, to min_mass or max_nodes): every record then carries its
    answer's exact probability (exact_prob) and every cell a G-test of its answers against it.
    """
    check_bool(resume, "resume")
    check_bool(exact, "exact")
    key_of = keyer(group, lambda t: tokenizer.decode([t]))
    if resume and out is None:
        raise MlxinferError("resume needs out, the results file to continue", "resume", "out")
    if out is not None and not isinstance(out, (str, os.PathLike)):
        raise MlxinferError(f"out must be a file's path, got {type(out).__name__}; give a .jsonl path", "out")
    if out is not None and not str(out).strip():
        raise MlxinferError("out is empty; give a .jsonl path", "out")
    plan = _plan(
        model, tokenizer, prompts, settings, seeds, max_tokens, chat, system, thinking, raw_special_tokens, stop
    )
    size = check_batch_size(batch_size)
    check_walk(min_mass, max_nodes, group, max_seconds)  # also where exact is off: a bad value is never ignored
    if exact:  # what each record's exact_prob depends on: a resume with other values would mix them
        plan.header["exact"] = {"group": group, "min_mass": min_mass, "max_nodes": max_nodes}
        if max_seconds is not None:  # a walk bound by time too (only then: files written without it still resume)
            plan.header["exact"]["max_seconds"] = max_seconds
    check_progress(progress)
    seed_ranks = rank_group.seed_group(model)
    rank, ranks = seed_ranks.rank(), seed_ranks.size()
    everyone = rank_group.group()
    split = model.info.sharding is not None  # the model is split across the ranks: all run every seed
    rank_group.agree({**plan.header, "seeds": plan.seeds, "walk": [exact, group, min_mass, max_nodes, max_seconds],
                      "resume": resume, "batch_size": size}, everyone)  # fmt: skip
    done, part = _resume(plan, out, resume, seed_ranks, everyone, split)
    try:  # the results file's lock is let go however the run ends
        _check_resumed(tokenizer, plan, done, out)
        pending = [
            (p, s, seed)
            for p in range(len(plan.ids))
            for s in range(len(plan.settings))
            for k, seed in enumerate(plan.seeds)
            if k % ranks == rank and (p, s, seed) not in done
        ]
        walks = {}
        if exact:  # before the draws, so that each record is written with its answer's exact probability
            options = dict(max_tokens=plan.max_tokens, stop=plan.stop or None, min_mass=min_mass, max_nodes=max_nodes,
                           max_seconds=max_seconds)  # fmt: skip
            with (
                results.stop_cleanly_on_sigterm(),
                _discarded_if_unused(part),
            ):  # as the draws: a failure leaves no file
                for p, s in itertools.product(range(len(plan.ids)), range(len(plan.settings))):
                    walks[p, s] = answers(model, tokenizer, plan.ids[p], settings=[plan.settings[s]],
                                          batch_size=size, group=group, **options)  # fmt: skip
                    if walks[p, s].stopped == "interrupted":  # Ctrl-C stops the sweep: no record with a partial walk's
                        raise KeyboardInterrupt  # probabilities is written

        probs = {cell: {a.answer: a.probs[0] for a in walk.answers} for cell, walk in walks.items()}

        def annotate(record: dict) -> dict:
            cell = record["prompt_index"], record["settings_index"]
            if cell in walks:
                key = key_of(record["text"], record["tokens"][0] if record["tokens"] else None)
                # None (null): the walk did not reach it (at most its remainder)
                record["exact_prob"] = exact_of(probs[cell], key, walks[cell].mass[0].remainder)
            return record

        start = time.perf_counter()
        new = _draw_pending(model, tokenizer, plan, pending, size, part, progress, annotate)
        seconds = time.perf_counter() - start
        merged = _gather(plan, list(done.values()) + new, out, part, seed_ranks)
        asked = set(plan.seeds)  # a resumed file may hold more seeds than this run asks for: they stay in the file
        merged = [r for r in merged if r["seed"] in asked]
        counts = [len(new), sum(len(r["tokens"]) for r in new)]
        if ranks > 1:  # the whole experiment's figures: sums over ranks, the slowest rank's time
            counts = [int(c) for c in mx.distributed.all_sum(mx.array(counts), group=seed_ranks).tolist()]
            seconds = max(mx.distributed.all_gather(mx.array([seconds]), group=seed_ranks).tolist())
        report = SweepReport(
            model.info.name,
            model.info.definition,
            None if out is None else str(out),
            everyone.size() if split else ranks,
            len(merged),
            counts[0],
            len(merged) - counts[0],
            counts[1],
            seconds,
            counts[1] / max(seconds, 1e-9),
            size,
            records=[SweepRecord(**r) for r in merged],
            sharding=model.info.sharding,
        )
        cell_settings = [s.to_dict() for s in plan.settings]
        report.cells = summarize(merged, plan.texts, cell_settings, lambda t: tokenizer.decode([t]), key_of, walks)
        return report
    finally:
        if part is not None:
            part.close()


def _resume(plan: _Plan, out, resume: bool, group, everyone, split: bool):
    """The records already done (key -> record) and this rank's results file (None: no file kept)."""
    rank, ranks = group.rank(), group.size()
    lead = not split or everyone.rank() == 0  # a split model: rank 0 alone keeps the results file
    done: dict = {}
    opened = []
    part, failure = None, None
    try:
        if out is not None and lead:  # a resume reads part files of as many ranks as wrote them
            results.check_parts(out, ranks, resume)
        if ranks > 1 and out is not None:  # rank 0 writes `out` whole at the end: what one rank refuses, refused now
            if rank == 0:
                results.check_target(out, resume)
            if resume and Path(out).expanduser().is_file():  # what an earlier run merged
                opened.append(results.ResultsFile(out, plan.header, resume=True, lock=False))
                done.update(opened[-1].done)
        if out is not None and lead:
            part = results.ResultsFile(out if ranks == 1 else f"{out}.rank{rank}of{ranks}", plan.header, resume)
            opened.append(part)
            done.update(part.done)
        if any(f.texts_fresh for f in opened):  # its texts begin as they did when it was written
            plan.after[:] = [()] * len(plan.after)
            plan.header.pop("continues")
    except MlxinferError as e:
        if not split and ranks == 1:
            raise
        failure = e
    if ranks > 1:  # one rank's refusal stops every rank before any draws (was: the others drew their share)
        try:
            rank_group.raise_any(failure, group)
        except MlxinferError:
            if part is not None:
                part.discard_if_unused()
                part.close()
            raise
    if split:  # rank 0's file decides which seeds are left, for every rank
        done = {results.record_key(r): r for r in rank_group.from_rank0(list(done.values()), everyone, failure)}
    return done, part


def _check_resumed(tokenizer, plan: _Plan, done: dict, out) -> None:
    """Each record read back says what its tokens give under this sweep's rules (its text, its ending):
    a record edited by hand would otherwise be tallied as if it had been drawn."""
    stop_ids = set(tokenizer.eos_token_ids)
    for record in done.values():
        tokens = record["tokens"]
        row = replay(tokenizer, tokens, plan.max_tokens, stop_ids, plan.stop, after=plan.after[record["prompt_index"]])
        early = row.ended and len(row.result.tokens) < len(tokens)
        if not row.ended and stop_ids:  # it ended on an end-of-turn token, which a record does not keep
            row.take(min(stop_ids), 0.0, [], "stop")
        if early or (row.result.text, row.result.finish_reason) != (record["text"], record["finish_reason"]):
            key = f"prompt {record['prompt_index']}, settings {record['settings_index']}, seed {record['seed']}"
            raise MlxinferError(
                f"out {out}: the record for {key} is not what its tokens give (its text or finish_reason was "
                "edited by hand): mend or delete that line",
                "out",
            )


def _draw_pending(model, tokenizer, plan: _Plan, pending, size, part, progress, annotate) -> list[dict]:
    """Each prompt prefilled once, each cell's seeds `size` rows per pass; records appended per batch."""
    new: list[dict] = []
    with results.stop_cleanly_on_sigterm(), _discarded_if_unused(part):
        for p in sorted({p for p, _, _ in pending}):
            prefilled = prefill(model, plan.ids[p])
            for s in sorted({s for q, s, _ in pending if q == p}):
                probs = first_token_probs(prefilled, plan.settings[s], model.info.cpu_kernels)
                cell = [seed for q, t, seed in pending if (q, t) == (p, s)]
                for g in range(0, len(cell), size):
                    batch = _draw_batch(model, tokenizer, prefilled, plan, p, s, cell[g : g + size], probs)
                    batch = [annotate(r) for r in batch]
                    if part is not None:
                        part.append(batch)
                    new += batch
                    if progress:
                        progress(len(new), len(pending))
    return new


@contextmanager
def _discarded_if_unused(part):
    try:
        yield
    except BaseException:
        if part is not None:
            part.discard_if_unused()
        raise


def _gather(plan: _Plan, mine: list[dict], out, part, group) -> list[dict]:
    """Every rank's records in key order; under mlx.launch rank 0 writes the one results file."""
    everything = rank_group.gather(mine, group)
    merged = sorted({results.record_key(r): r for r in everything}.values(), key=results.record_key)
    if group.size() > 1 and out is not None:
        if group.rank() == 0:
            results.write_whole(out, plan.header, merged)
        rank_group.barrier(group)
        Path(part.path).unlink(missing_ok=True)
    return merged


def _draw_batch(model, tokenizer, prefilled, plan: _Plan, p: int, s: int, seeds, probs) -> list[dict]:
    """One forward pass per step for these seeds; their records, in seed order."""
    settings = plan.settings[s]
    specs = [RowSpec(seed, settings, plan.max_tokens, stop=plan.stop, after=plan.after[p]) for seed in seeds]
    rows = [None] * len(specs)
    for live, step in decode(model, tokenizer, prefilled, specs, step_logprobs=False):
        if step.token is None:
            rows[live.index] = live.result
    firsts = [row.first_token for row in rows]
    first_probs = probs[mx.array([f if f is not None else 0 for f in firsts])].tolist()
    return [
        SweepRecord(
            p,
            plan.texts[p],
            plan.hashes[p],
            s,
            settings.to_dict(),
            seed,
            row.text,
            row.tokens,
            row.finish_reason,
            firsts[i] if firsts[i] is not None else -1,
            first_probs[i],
        ).to_dict(exact=False)
        for i, (seed, row) in enumerate(zip(seeds, rows))
    ]
