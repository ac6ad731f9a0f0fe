"""The prompt read token by token: how the model splits it, and how likely it found each token.

One forward pass over a prompt computes scores at every position, not only the last: position i's
scores are the model's guess at token i + 1. `prompt_logprobs` reads them all: for each token its
probability given the tokens before it (at temperature 1, the model's own distribution), its rank
among the vocabulary, the model's best guesses there, and over the whole prompt the perplexity,
exp of the mean negative log-probability (what llama.cpp's perplexity tool and `quality` report).
The same numbers as OpenAI's `echo` with `logprobs` and vLLM's `prompt_logprobs`.
"""

from __future__ import annotations

import math

import mlx.core as mx

from ..errors import MlxinferError, is_whole
from ..model.finite import check_scores
from ..sampler import log_softmax
from ..tokenizer import encode_prompt
from ..views import Alternative, PromptReading, PromptToken
from .decode import check_ids
from .request import check_pair

CHUNK = 256  # positions scored per pass: their (CHUNK, V) scores are held at once (50 MB for V = 49,152)
MOST_ALTERNATIVES = 20  # best guesses listed per position at most (OpenAI's top_logprobs limit)


def prompt_logprobs(
    model,
    tokenizer,
    prompt: str | list[int] | list[dict],
    *,
    top: int = 1,
    chat: bool = True,
    system: str | None = None,
    thinking: bool = False,
    raw_special_tokens: bool = False,
) -> PromptReading:
    """Every token of the (templated) prompt with its log-probability given the tokens before it,
    its rank by score, and the model's `top` best guesses at its position (0 for none); the first
    token has nothing before it and no probability. Scores are computed CHUNK positions at a time
    through the KV cache, so a long prompt holds one chunk's scores, not all of them."""
    check_pair(model, tokenizer)
    if not is_whole(top) or not 0 <= top <= MOST_ALTERNATIVES:
        raise MlxinferError(f"top must be a whole number from 0 to {MOST_ALTERNATIVES}, got {top!r}", "top")
    ids = encode_prompt(  # a text far past the context is refused from its first part, not encoded whole
        tokenizer, prompt, chat=chat, system=system, thinking=thinking, raw_special_tokens=raw_special_tokens,
        context=model.config.max_position_embeddings,
    )  # fmt: skip
    ids = check_ids(model, ids)
    pieces = [tokenizer.decode([t]) for t in ids]
    tokens = [PromptToken(0, ids[0], pieces[0], None, None, None, [])]
    cache = model.make_cache()
    for start in range(0, len(ids) - 1, CHUNK):  # the last token predicts nothing: it is never fed
        part = ids[start : min(start + CHUNK, len(ids) - 1)]
        scores = model(mx.array(part)[None], cache=cache)[0].astype(mx.float32)  # (L, V)
        check_scores(model, ids[: start + len(part)], scores)
        logprobs = log_softmax(scores, model.info.cpu_kernels)  # (L, V): the kernels' exact exp where the path has them
        following = mx.array(ids[start + 1 : start + 1 + len(part)])[:, None]  # (L, 1): the token each guessed
        chosen = mx.take_along_axis(scores, following, axis=-1)  # (L, 1)
        ranks = mx.sum(scores > chosen, axis=-1) + 1  # (L,): ties count in the token's favour
        lp = mx.take_along_axis(logprobs, following, axis=-1)[:, 0]  # (L,)
        if top:  # the top few by a partition, then sorted: a full sort of every row took 10x longer
            best = mx.argpartition(-scores, kth=top - 1, axis=-1)[:, :top]  # (L, top), in no order
            order = mx.argsort(-mx.take_along_axis(scores, best, axis=-1), axis=-1)
            best = mx.take_along_axis(best, order, axis=-1)
        else:
            best = mx.zeros((len(part), 0), mx.int32)
        best_lp = mx.take_along_axis(logprobs, best, axis=-1)
        for j, (p, r, b, blp) in enumerate(zip(lp.tolist(), ranks.tolist(), best.tolist(), best_lp.tolist())):
            i = start + j + 1
            guesses = [Alternative(t, tokenizer.decode([t]), v) for t, v in zip(b, blp)]
            tokens.append(PromptToken(i, ids[i], pieces[i], p, math.exp(p), r, guesses))
    scored = [t.logprob for t in tokens[1:]]
    total = sum(scored)
    return PromptReading(
        model=model.info.name,
        definition=model.info.definition,
        prompt=prompt if isinstance(prompt, str) else "",
        tokens=tokens,
        scored=len(scored),
        logprob=total,
        perplexity=math.exp(-total / len(scored)) if scored else None,
        first_guesses=sum(t.rank == 1 for t in tokens[1:]),
    )
