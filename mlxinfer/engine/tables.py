"""One forward pass, read as the lesson reads it: the next-token table, and what the sampler
does to it.

`next_token_table` runs the (templated) prompt through the model once, takes the scores at
the last position, and lists the top-k tokens by score with their probability at each
temperature (softmax over the whole vocabulary). With sampler settings it also explains one
step of the sampler: which of those tokens the cut keeps, rescaled to 1.
"""

from __future__ import annotations

from typing import Callable, Iterable, Mapping, Sequence

import mlx.core as mx
import numpy as np

from ..errors import MlxinferError, check_bool, check_listed_once, check_whole, is_whole, shown
from ..sampler import kept_probabilities
from ..settings import SamplerSettings, check_temperature, resolve_settings
from ..tokenizer import encode_prompt
from ..views import ExpertChoice, ExplainRow, Explanation, NextTokenTable, TokenRow
from . import ranks
from .decode import prefill
from .request import check_model, check_pair


def next_token_scores(model, ids: list[int]) -> mx.array:
    """The scores at the last position, float32, shape (V,): the prompt prefilled into a KV cache as every
    draw's is (decode.prefill), so the table reads the numbers the sampler draws from. A pass without the
    cache takes other kernels (the composed attention): 5e-5 apart on the quantized path, up to 0.8 on int8.
    On the native paths only the last position goes through the output table, the largest matmul."""
    # (was: the tokenizer in the model's place an AttributeError inside transformers)
    check_model(model, " (next_token_scores(model, ids): the prompt's token ids, tokenizer.encode(text) or "
                "encode_prompt(tokenizer, text))")  # fmt: skip
    return prefill(model, ids).logits[0].astype(mx.float32)


def check_table_args(temperatures: Sequence[float], k: int, vocab: int) -> list[float]:
    if isinstance(temperatures, (int, float)) and not isinstance(temperatures, bool):
        temperatures = [temperatures]  # one temperature: a table of one column
    if isinstance(temperatures, (str, bytes)) or not isinstance(temperatures, Iterable):
        raise MlxinferError(f"temperatures must be a list of numbers, got {temperatures!r:.60}", "temperatures")
    temperatures = [check_temperature(t, "temperatures") for t in temperatures]
    if not temperatures:
        raise MlxinferError("temperatures is empty; give at least one", "temperatures")
    check_listed_once(temperatures, "temperatures")
    if not is_whole(k) or not 1 <= k <= vocab:
        raise MlxinferError(f"k must be between 1 and the vocabulary size {vocab:,}, got {shown(k, int)}", "k")
    return temperatures


def table_from_scores(
    scores: mx.array,
    temperatures: Sequence[float] = (0.5, 1.0, 1.5),
    k: int = 6,
    decode: Callable[[int], str] | None = None,
) -> NextTokenTable:
    """The lesson's table from a row of scores (V,): the top k by score, their probability per temperature."""
    x = _score_row(scores)
    temperatures = check_table_args(temperatures, k, x.shape[-1])
    top = mx.argsort(-x)[:k]
    ids = top.tolist()
    probs = [_softmax64(x, t)[ids].tolist() for t in temperatures]
    logprobs = _softmax64(x, 1.0, log=True)[ids].tolist()
    rows = [
        TokenRow(r + 1, ids[r], decode(ids[r]) if decode else None, s, [p[r] for p in probs], logprobs[r])
        for r, s in enumerate(x[top].tolist())
    ]
    return NextTokenTable("", "", [], x.shape[-1], temperatures, rows, [sum(p) for p in probs])


def _softmax64(x: mx.array, temperature: float, log: bool = False) -> np.ndarray:
    """softmax(x / T) (or its log) in float64: MLX's CPU softmax and logsumexp are off by up to ~2e-4 (relative)
    on a 49,152-token row, which showed the table's probabilities apart from generate's and tokens'."""
    xs = np.asarray(x, dtype=np.float64)
    if not np.isfinite(xs.max()):  # every score -inf: no distribution (NaN, as MLX's softmax gives), quietly
        return np.full_like(xs, np.nan)
    if temperature == 0:  # all of it on the argmax, as the sampler's
        out = np.zeros_like(xs)
        out[int(np.argmax(xs))] = 1.0
        return np.log(out) if log else out
    z = xs / temperature
    z -= z.max()
    lse = np.log(np.sum(np.exp(z)))
    return z - lse if log else np.exp(z - lse)


def _score_row(scores) -> mx.array:
    """scores (an mx or numpy array, or a list of numbers) as one float32 row (V,): not empty, no NaN or +inf."""
    try:
        x = scores if isinstance(scores, mx.array) else mx.array(scores)
    except (TypeError, ValueError):
        raise MlxinferError(f"scores must be an array of numbers, got {type(scores).__name__}", "scores") from None
    if x.ndim > 1 and x.size != x.shape[-1]:  # a model's whole output (B, L, V): which row was meant?
        raise MlxinferError(f"scores has shape {tuple(x.shape)}; pass one row, e.g. logits[0, -1]", "scores")
    x = x.reshape(-1).astype(mx.float32)
    if x.size == 0:
        raise MlxinferError("scores is empty; give one score per token", "scores")
    if mx.any(mx.isnan(x) | (x == mx.inf)).item():
        raise MlxinferError(
            "scores hold NaN or +inf, so they give no probabilities; check the model's output", "scores"
        )
    return x


def explain(
    scores: mx.array,
    settings: SamplerSettings,
    k: int = 10,
    decode: Callable[[int], str] | None = None,
    history=None,
    allowed=None,
    fast: bool = False,
) -> Explanation:
    """One step of the sampler as a table: the k best tokens by score, their probability at the
    temperature, whether the cut keeps them and their rescaled probability. fast: the model's CPU
    kernels cut its draws (model.info.cpu_kernels), so the table's cut is theirs (sampler/stages.py)."""
    settings = resolve_settings(settings, None)[0]  # a SamplerSettings, a dict of its fields or None
    x = _score_row(scores)
    check_whole(k, "k", 1, "a whole number, at least 1")
    check_bool(fast, "fast")
    x, _, kept, _ = kept_probabilities(x, settings, history, allowed, fast)  # the kept set: the sampler's own
    probs, keep = _softmax64(x, settings.temperature), np.asarray(kept)  # shown in float64, as the table's
    held = np.where(keep, probs, 0.0)
    mass_kept = min(1.0, float(held.sum()))  # float64 sums of a whole row can land a bit past 1
    final = held / mass_kept if mass_kept > 0 else held
    top = mx.argsort(-x)[: min(k, x.shape[-1])]
    ids, s = top.tolist(), x[top].tolist()
    running = [None] * len(ids)  # the mass top-p reads, where it reads the whole row first: mlx-lm's order
    if settings.order == "mlx-lm" or not (0 < settings.top_k < x.shape[-1]):  # (untempered), or no top-k before
        seen = probs if settings.order != "mlx-lm" else _softmax64(x, 1.0)
        running = np.cumsum(seen[ids]).tolist()
    rows = [
        ExplainRow(r + 1, i, decode(i) if decode else None, s[r], float(probs[i]), bool(keep[i]), float(final[i]),
                   running[r])
        for r, i in enumerate(ids)
    ]  # fmt: skip
    cut = max(0.0, 1.0 - mass_kept)
    return Explanation(settings.to_dict(), x.shape[-1], int(keep.sum()), mass_kept, cut, rows)


def next_token_table(
    model,
    tokenizer,
    prompt: str | list[int],
    *,
    temperatures: Sequence[float] = (0.5, 1.0, 1.5),
    k: int = 6,
    settings: SamplerSettings | Mapping | None = None,
    explain_sampler: bool = False,
    chat: bool = True,
    system: str | None = None,
    thinking: bool = False,
    raw_special_tokens: bool = False,
) -> NextTokenTable:
    """The lesson's table for one prompt (text, or token ids as they are).

    With `settings` (a SamplerSettings, or a dict of the fields you set: the rest come from the
    model's generation_config.json) or `explain_sampler=True`, the table also explains one step
    of the sampler: which tokens survive its cut. raw_special_tokens: see encode_prompt.
    """
    check_pair(model, tokenizer)
    check_bool(explain_sampler, "explain_sampler")
    temperatures = check_table_args(temperatures, k, model.config.vocab_size)
    resolved = None
    if settings is not None or explain_sampler:
        resolved = resolve_settings(settings, model.info.generation_config)
    ids = encode_prompt(  # a text far past the context is refused from its first part, not encoded whole
        tokenizer, prompt, chat=chat, system=system, thinking=thinking, raw_special_tokens=raw_special_tokens,
        context=model.config.max_position_embeddings,
    )  # fmt: skip
    if model.info.sharding:  # every rank takes part in the pass: the same prompt on each
        ranks.agree({"model": ranks.identity(model), "prompt": ids}, ranks.group())
    scores = next_token_scores(model, ids)

    def decode(i: int) -> str:
        return tokenizer.decode([i])

    table = of_model(table_from_scores(scores, temperatures, k, decode), model, prompt, ids)
    if resolved is not None:
        # the prompt is the penalties' history, as it is for generate's first draw
        table.explanation = explain(scores, resolved[0], k, decode, history=ids, fast=model.info.cpu_kernels)
        table.settings_note = resolved[1]
        table.routing = expert_routing(model, ids)
    return table


def of_model(table: NextTokenTable, model, prompt, ids: list[int]) -> NextTokenTable:
    """The table with the facts of the model and prompt it came from: the name, which definition ran, on
    which compute path, how it is split across ranks (topk's header and the explorer's say them)."""
    table.model, table.prompt, table.prompt_ids = model.info.name, prompt if isinstance(prompt, str) else "", ids
    table.definition, table.weights, table.sharding = model.info.definition, model.info.weights, model.info.sharding
    return table


def expert_routing(model, ids: list[int]) -> list[ExpertChoice] | None:
    """For a mixture of experts run by our own definition: in each layer with experts, the experts the
    router chose for the last token and their weights. None for any other model."""
    if not getattr(model.config, "num_experts", 0) or not hasattr(model, "run_layers"):
        return None
    from ..model.moe import last_token_routing

    return [ExpertChoice(i, e, w) for i, e, w in last_token_routing(model, mx.array(ids)[None])]
