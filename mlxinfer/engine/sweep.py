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

import hashlib
import itertools
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import mlx.core as mx

from ..errors import MlxinferError
from ..sampler import NEG_INF, adjust, cut_tail, log_softmax, probabilities
from ..settings import SamplerSettings, resolve_settings
from ..tokenizer import encode_prompt
from ..views import SweepRecord, SweepReport
from . import ranks as rank_group
from . import results
from .decode import Prefilled, RowSpec, check_context, check_max_tokens, decode, prefill
from .experiments import check_batch_size, seed_list
from .summary import summarize

GRID_FIELDS = ("temperature", "top_p", "top_k", "min_p")


def settings_grid(
    temperatures: Sequence[float],
    top_p: Sequence[float] | None = None,
    top_k: Sequence[int] | None = None,
    min_p: Sequence[float] | None = None,
) -> list[dict]:
    """Every combination of the values given (a field left None is not set: generation_config.json's)."""
    axes = [
        (name, list(values))
        for name, values in zip(GRID_FIELDS, (temperatures, top_p, top_k, min_p))
        if values is not None
    ]
    empty = [name for name, values in axes if not values]
    if empty:
        param = {"temperature": "temperatures"}.get(empty[0], empty[0])
        raise MlxinferError(f"{param} is empty, so the grid has no cells; give at least one value", param)
    return [dict(zip([n for n, _ in axes], combo)) for combo in itertools.product(*[v for _, v in axes])]


def prompts_from_file(path: str | Path) -> list[str]:
    """One prompt per line (blank lines skipped)."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = "is not UTF-8 text" if isinstance(e, UnicodeDecodeError) else f"cannot be read ({e.strerror})"
        raise MlxinferError(
            f"prompts_file {path} {why}; give a UTF-8 text file, one prompt per line", "prompts_file"
        ) from None
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise MlxinferError(f"prompts_file {path} holds no prompt; write one per line", "prompts_file")
    return prompts


def first_token_probs(prefilled: Prefilled, settings: SamplerSettings) -> mx.array:
    """(V,) each token's probability as the first draw under `settings`: adjusted, tempered, cut, rescaled."""
    x = adjust(prefilled.logits.reshape(-1).astype(mx.float32), settings, history=prefilled.ids)
    kept = cut_tail(log_softmax(x), settings) > NEG_INF
    p = mx.where(kept, probabilities(x, settings.temperature), 0.0)
    return p / mx.sum(p)


def _fingerprint(model) -> dict:
    cfg, info = model.config, model.info
    return {
        "name": info.name,
        "definition": info.definition,
        "weights": info.weights,
        "compute_dtype": info.compute_dtype,
        "vocab_size": cfg.vocab_size,
        "layers": cfg.num_hidden_layers,
    }


def sweep(
    model,
    tokenizer,
    prompts: Sequence[str | list[int]],
    *,
    settings: Sequence[SamplerSettings | Mapping[str, Any]],
    seeds: int | str | Sequence[int],
    max_tokens: int = 5,
    batch_size: Optional[int] = None,
    chat: bool = True,
    system: Optional[str] = None,
    thinking: bool = False,
    raw_special_tokens: bool = False,
    out: str | Path | None = None,
    resume: bool = False,
    progress: Optional[Callable[[int, int], None]] = None,
) -> SweepReport:
    """Every prompt x every settings entry x every seed: one completion each, and the summary per cell.

    settings: each a SamplerSettings or a dict of the fields set (the rest from generation_config.json);
    `settings_grid` builds the product of value lists. out: a .jsonl results file, appended per batch;
    resume=True skips the completions it already holds (it must be the same experiment).
    raw_special_tokens: see encode_prompt.
    """
    prompts = list(prompts)
    if not prompts:
        raise MlxinferError("prompts is empty; give at least one prompt", "prompts")
    if isinstance(settings, (SamplerSettings, Mapping)) or not list(settings):
        raise MlxinferError("settings must be a non-empty list of settings (see settings_grid)", "settings")
    seed_ids = seed_list(seeds)
    check_max_tokens(max_tokens)
    size = check_batch_size(batch_size)
    resolved = [resolve_settings(s, model.info.generation_config)[0] for s in settings]
    ids = [
        encode_prompt(tokenizer, p, chat=chat, system=system, thinking=thinking, raw_special_tokens=raw_special_tokens)
        for p in prompts
    ]
    for prompt_ids in ids:
        check_context(model, len(prompt_ids), max_tokens)
    texts = [p if isinstance(p, str) else tokenizer.decode(p) for p in prompts]
    hashes = [hashlib.sha256(str(i).encode()).hexdigest() for i in ids]
    header = {
        "model": _fingerprint(model),
        "prompts": texts,
        "prompt_sha256": hashes,
        "settings": [s.to_dict() for s in resolved],
        "max_tokens": max_tokens,
        "chat": chat,
        "system": system,
        "thinking": thinking,
    }
    group = rank_group.seed_group(model)
    rank, ranks = group.rank(), group.size()
    everyone = rank_group.group()
    split = model.info.sharding is not None  # the model is split across the ranks: all run every seed
    lead = not split or everyone.rank() == 0  # ... and rank 0 alone keeps the results file

    done: dict = {}
    if ranks > 1 and out is not None and resume and Path(out).expanduser().is_file():
        done.update(results.ResultsFile(out, header, resume=True).done)  # what an earlier run merged
    part, failure = None, None
    try:
        if out is not None and lead:
            part = results.ResultsFile(out if ranks == 1 else f"{out}.rank{rank}of{ranks}", header, resume)
            done.update(part.done)
    except MlxinferError as e:
        if not split:
            raise
        failure = e
    if split:  # rank 0's file decides which seeds are left, for every rank
        done = {results.record_key(r): r for r in rank_group.from_rank0(list(done.values()), everyone, failure)}

    pending = [
        (p, s, seed)
        for p in range(len(prompts))
        for s in range(len(resolved))
        for k, seed in enumerate(seed_ids)
        if k % ranks == rank and (p, s, seed) not in done
    ]
    new: list[dict] = []
    tokens = 0
    start = time.perf_counter()
    with results.stop_cleanly_on_sigterm():
        for p in sorted({p for p, _, _ in pending}):
            prefilled = prefill(model, ids[p])
            for s in sorted({s for q, s, _ in pending if q == p}):
                probs = first_token_probs(prefilled, resolved[s])
                cell = [seed for q, t, seed in pending if (q, t) == (p, s)]
                for g in range(0, len(cell), size):
                    batch = _run_batch(
                        model,
                        tokenizer,
                        prefilled,
                        cell[g : g + size],
                        resolved[s],
                        max_tokens,
                        probs,
                        (p, texts[p], hashes[p], s),
                    )
                    tokens += sum(len(r["tokens"]) for r in batch)
                    if part is not None:
                        part.append(batch)
                    new += batch
                    if progress:
                        progress(len(new), len(pending))
    seconds = time.perf_counter() - start

    mine = list(done.values()) + new
    everything = rank_group.gather(mine, group)
    merged = sorted({results.record_key(r): r for r in everything}.values(), key=results.record_key)
    if ranks > 1 and out is not None:
        if rank == 0:
            results.write_whole(out, header, merged)
        rank_group.barrier(group)
        Path(part.path).unlink(missing_ok=True)
    counts = [len(new), tokens]
    if ranks > 1:  # the whole experiment's figures: sums over ranks, the slowest rank's time
        counts = [int(c) for c in mx.distributed.all_sum(mx.array(counts), group=group).tolist()]
        seconds = max(mx.distributed.all_gather(mx.array([seconds]), group=group).tolist())
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
    report.cells = summarize(merged, texts, [s.to_dict() for s in resolved], lambda t: tokenizer.decode([t]))
    return report


def _run_batch(model, tokenizer, prefilled, seeds, settings, max_tokens, probs, where) -> list[dict]:
    """One forward pass per step for these seeds; their records, in seed order."""
    p, prompt, sha, s = where
    specs = [RowSpec(seed, settings, max_tokens) for seed in seeds]
    texts: list[list[str]] = [[] for _ in specs]
    tokens: list[list[int]] = [[] for _ in specs]
    finish: list[Any] = [None] * len(specs)
    firsts: list[Any] = [None] * len(specs)
    for i, step in decode(model, tokenizer, prefilled, specs, step_logprobs=False):
        texts[i].append(step.text)
        if step.token is not None:
            tokens[i].append(step.token)
        else:
            finish[i] = step
        if firsts[i] is None:
            firsts[i] = step.token if step.token is not None else step.stop_token
    first_probs = probs[mx.array([f if f is not None else 0 for f in firsts])].tolist()
    return [
        SweepRecord(
            p,
            prompt,
            sha,
            s,
            settings.to_dict(),
            seed,
            "".join(texts[i]),
            tokens[i],
            finish[i].finish_reason,
            firsts[i] if firsts[i] is not None else -1,
            first_probs[i],
        ).to_dict()
        for i, seed in enumerate(seeds)
    ]
