"""One forward pass, read as the lesson reads it: the next-token table.

`next_token_table` runs the (templated) prompt through the model once, takes the
scores at the last position, and lists the top-k tokens by score with their
probability at each temperature (softmax over the whole vocabulary).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import mlx.core as mx

from .errors import MlxinferError
from .tokenizer import encode_prompt


@dataclass
class TokenRow:
    rank: int
    id: int
    text: str
    score: float
    probs: list[float]  # one per temperature
    logprob: float  # at temperature 1.0


@dataclass
class NextTokenTable:
    model: str
    prompt: str
    prompt_ids: list[int]
    n_scores: int  # one score per vocabulary entry
    temperatures: list[float]
    rows: list[TokenRow]
    mass: list[float]  # probability the k rows hold, per temperature
    extra: dict = field(default_factory=dict)  # e.g. the sampler's explanation

    def to_dict(self) -> dict:
        return asdict(self)


def last_scores(model, ids: list[int]) -> mx.array:
    """The scores at the last position, float32, shape (V,).

    Only that position goes through the output table: the others' scores are never read,
    and the table is the largest single matmul (49152 x 576 for SmolLM2).
    """
    check_context(model, len(ids))
    h = model.run_layers(model.embed_tokens(mx.array(ids)[None]))  # (1, L, D)
    return model.logits_from_hidden(h[:, -1:, :])[0, -1].astype(mx.float32)


def check_context(model, n_tokens: int, extra: int = 0) -> None:
    limit = model.config.max_position_embeddings
    if n_tokens == 0:
        raise MlxinferError("the prompt is empty; give some text with --prompt")
    if n_tokens + extra > limit:
        raise MlxinferError(
            f"the prompt is {n_tokens:,} tokens{f' plus {extra:,} to generate' if extra else ''} but the model's "
            f"context is {limit:,}; shorten the prompt"
        )


def validate_table_args(temperatures: list[float], k: int, vocab: int) -> None:
    if not temperatures:
        raise MlxinferError("give at least one temperature with --temps")
    bad = [t for t in temperatures if t < 0]
    if bad:
        raise MlxinferError(f"temperature must be >= 0, got {bad[0]}; use 0 for greedy or a positive value")
    if not 1 <= k <= vocab:
        raise MlxinferError(f"-k must be between 1 and the vocabulary size {vocab:,}, got {k}")


def next_token_table(
    model,
    tokenizer,
    prompt: str,
    temperatures: tuple[float, ...] = (0.5, 1.0, 1.5),
    k: int = 6,
    *,
    chat: bool = True,
    thinking: bool = False,
    system: str | None = None,
    settings=None,
) -> NextTokenTable:
    """The lesson's table for one prompt; with sampler `settings`, also which tokens survive the cut."""
    temperatures = list(temperatures)
    validate_table_args(temperatures, k, model.config.vocab_size)
    ids = encode_prompt(tokenizer, prompt, chat=chat, system=system, thinking=thinking)
    scores = last_scores(model, ids)
    table = table_from_scores(scores, tokenizer, temperatures, k, model_name=_name(model), prompt=prompt, ids=ids)
    if settings is not None:
        from .sampler import explain

        table.extra["explain"] = explain(scores, settings, k, decode=lambda i: tokenizer.decode([i])).to_dict()
    return table


def table_from_scores(scores, tokenizer, temperatures, k, *, model_name="", prompt="", ids=()) -> NextTokenTable:
    from .sampler import probability_table

    pt = probability_table(scores, temperatures, k, decode=lambda i: tokenizer.decode([i]))
    logprobs = (scores - mx.logsumexp(scores))[mx.array(pt.tokens)].tolist()
    rows = [
        TokenRow(rank=i + 1, id=tid, text=pt.texts[i], score=pt.scores[i],
                 probs=[pt.probs[t][i] for t in temperatures], logprob=logprobs[i])
        for i, tid in enumerate(pt.tokens)
    ]
    return NextTokenTable(
        model=model_name,
        prompt=prompt,
        prompt_ids=list(ids),
        n_scores=pt.vocab_size,
        temperatures=temperatures,
        rows=rows,
        mass=[pt.mass[t] for t in temperatures],
    )


def _name(model) -> str:
    src = getattr(model, "source", None)
    return src.name if src is not None else ""
