"""A forward pass that yields NaN or inf is an error that names where it began, never a table of scores.

Corrupt weights (a GGUF whose data is all 0xFF bytes decodes to NaN scales) load without complaint:
every value has a valid encoding. The scores then come out NaN, and a softmax of them is NaN too.
`check_scores` looks at the scores a command is about to show (one cheap reduction); only when they
are not finite does it run the prompt again layer by layer to find the first place that went wrong.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..errors import MlxinferError


def check_scores(model, ids: list[int], scores: mx.array) -> None:
    """Raise MlxinferError if `scores` hold NaN or inf; its message names the first layer where they
    appear, its `detail` lists every stage (NaN and inf counts, the largest finite magnitude)."""
    if all_finite(scores):
        return
    stages = trace(model, ids)
    first = next((s for s in stages if s["nan"] or s["inf"]), None)
    where = f" from {first['stage']} on" if first else ""
    e = MlxinferError(
        f"the model's forward pass gives NaN or inf{where}, so it has no scores to show; its weights are "
        "corrupt or do not fit the config: re-download or re-convert the model",
        "source",
    )
    e.detail = [
        f"{s['stage']:<40} NaN {s['nan']:>9,}  inf {s['inf']:>9,}  largest finite |x| {s['max_abs']:.4g}"
        for s in stages
    ]
    raise e


def all_finite(scores: mx.array) -> bool:
    """Whether every value of `scores` is finite: numpy's vectorised isfinite over a view of the evaluated
    array (~0.3 ms for 64 rows of 49k on a CPU, where MLX's isfinite and all take ~7.6)."""
    if scores.dtype == mx.bfloat16:  # a dtype numpy has no view for
        scores = scores.astype(mx.float32)
    return bool(np.isfinite(np.asarray(scores)).all())


def trace(model, ids: list[int]) -> list[dict]:
    """The prompt through `model` one stage at a time: embedding, each layer, the output table."""
    if not all(hasattr(model, a) for a in ("embed", "layers", "logits_from_hidden")):
        return []  # a model class of another shape: the message then names no layer
    h = model.embed(mx.array(ids)[None])
    stages = [_stage("the embedding (model.embed_tokens)", h)]
    mask = "causal" if len(ids) > 1 else None
    for i, layer in enumerate(model.layers):
        h = layer(h, mask, None)
        stages.append(_stage(f"layer {i} (model.layers.{i})", h))
    stages.append(_stage("the output (model.norm, lm_head)", model.logits_from_hidden(h)))
    return stages


def _stage(name: str, x: mx.array) -> dict:
    x = x.astype(mx.float32)
    finite = mx.isfinite(x)
    nan, inf = mx.isnan(x).sum(), (mx.isinf(x)).sum()
    largest = mx.max(mx.where(finite, mx.abs(x), 0.0))
    mx.eval(nan, inf, largest)
    return {"stage": name, "nan": nan.item(), "inf": inf.item(), "max_abs": largest.item()}
