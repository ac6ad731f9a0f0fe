"""What quantization costs: bytes, and how far the next-token distributions move, over a fixed text.

For every model: its weights' bytes as stored and bits per weight (bytes x 8 / parameters, norms
included); over the shipped text (quant/data/eval.txt, or any text file), in independent windows of
`window` tokens, each position's next-token distribution is compared with the reference's:

  KL      mean over positions of KL(reference || candidate) = sum_v p_ref(v) (log p_ref(v) - log p_cand(v)),
          in nats
  top-1   the share of positions where both models' most likely next token is the same
  PPL     exp(mean negative log-likelihood of the text's actual next token), for every model

Every model is evaluated through a float32 copy of its weights: each quantized Linear/Embedding is
dequantized (s * q + b in float32) into a plain float32 nn.Linear/nn.Embedding. The quantization
error lives in the weights, not in the matmul, so this measures exactly what the stored numbers
cost, and on a CPU the float32 matmuls (BLAS) are far faster than MLX's quantized kernels.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from mlxinfer import defaults
from mlxinfer.errors import MlxinferError, check_whole, is_whole
from mlxinfer.formats import ggml_types, gguf
from mlxinfer.formats.paths import read_text_file
from mlxinfer.formats.sources import is_embedded, resolve
from mlxinfer.model.convert import to_float32
from mlxinfer.model.params import unpacked_parameter_count
from mlxinfer.model.finite import check_scores
from mlxinfer.sampler import log_softmax

from . import affine
from .export import load, source_bytes

TEXT = Path(__file__).parent / "data" / "eval.txt"
DEFAULT_WINDOW = defaults.QUALITY_WINDOW
MAX_TEXT_BYTES = 64 << 20


@dataclass
class QualityProgress:
    """Where evaluate stands, given to its `progress` callable after each window and each model."""

    model: str  # the model's label
    index: int  # 0: the reference, then each candidate
    models: int
    window: int  # windows of this model done
    windows: int
    line: str | None = None  # when the model is done: its result in one line


@dataclass
class ModelQuality:
    name: str
    weights: str  # e.g. "4-bit g64; model.embed_tokens 8-bit g64", "bfloat16"
    parameters: int
    bytes: int
    bits_per_weight: float
    perplexity: float
    kl_mean: float | None = None  # None for the reference itself
    kl_max: float | None = None
    top1_agreement: float | None = None


@dataclass
class QualityReport:
    text: str
    tokens: int
    positions: int  # next-token predictions compared
    window: int
    reference: ModelQuality
    candidates: list[ModelQuality] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def check_quality_options(max_tokens: int | None, window: int) -> None:
    """evaluate's token options, checked alone (quantize --report checks them before it writes)."""
    check_whole(window, "window", 2, "2 tokens or more")
    if max_tokens is not None and (not is_whole(max_tokens) or max_tokens < 2):
        raise MlxinferError(f"max_tokens must be 2 or more, got {max_tokens!r}", "max_tokens")


def _check_window(model, window: int, label: str) -> None:
    """A window past the model's context would measure positions it was never trained on."""
    context = model.config.max_position_embeddings
    if window > context:
        raise MlxinferError(
            f"window {window:,} is longer than {label}'s context of {context:,} tokens; lower it", "window"
        )


def evaluate(
    reference,
    candidates,
    *,
    max_tokens: int | None = None,
    window: int = DEFAULT_WINDOW,
    text: str | Path | None = None,
    names: list[str] | None = None,
    progress=None,
) -> QualityReport:
    """Compare each candidate with the reference over the text (see the module docstring). Every
    argument is checked before the reference runs: each model found, the text read, and each candidate
    loaded once (its files read and checked as the loader checks them: safetensors headers, config.json,
    the tokenizer against the weights), its context against the window, and its tokenizer and vocabulary
    against the reference's. So a corrupt or mismatched candidate is an error at once, not after the
    reference's whole run. (A candidate is loaded again for its own run: one model in memory at a time.)

    progress: an optional callable given a QualityProgress after each window of each model."""
    tell = progress or (lambda _step: None)
    if not candidates:
        raise MlxinferError("candidates is empty; give at least one model to compare with the reference", "candidates")
    check_quality_options(max_tokens, window)
    if text is not None and not str(text).strip():  # was: the shipped text, silently
        raise MlxinferError("text is empty; give the path of a UTF-8 text file (or none: the shipped one)", "text")
    path = Path(text).expanduser() if text is not None else TEXT
    content = read_text_file(path, "text", MAX_TEXT_BYTES)
    sources = [reference, *candidates]
    if names is not None and len(names) != len(sources):
        raise MlxinferError(f"names has {len(names)} names for {len(sources)} models (the reference first)", "names")
    for source in sources:
        resolve(None if is_embedded(source) else source, weights=False)  # there, and a model: before any load
    labels = names or [_label(s) for s in sources]

    opened = []  # each candidate's reading of the text and vocabulary size, to compare with the reference's
    for source, label in zip(candidates, labels[1:]):
        model, tok = load(source)
        _check_window(model, window, label)
        opened.append((tok.encode(content)[:max_tokens], model.config.vocab_size))
        del model, tok

    ref_model, ref_tok = load(reference)
    _check_window(ref_model, window, labels[0])
    ids = ref_tok.encode(content)
    if max_tokens is not None:
        ids = ids[:max_tokens]
    ref_vocab = ref_model.config.vocab_size
    for (read, vocab), label in zip(opened, labels[1:]):
        _check_same_reading(label, read[: len(ids)] == ids, vocab, ref_vocab)
    windows = [ids[i : i + window] for i in range(0, len(ids), window)]
    windows = [w for w in windows if len(w) >= 2]
    if not windows:
        raise MlxinferError(f"{path} gives fewer than 2 tokens; nothing to compare")
    positions = sum(len(w) - 1 for w in windows)

    def step(index: int, done: int, line: str | None = None) -> None:
        tell(QualityProgress(labels[index], index, len(sources), done, len(windows), line))

    ref_row = _describe(ref_model, labels[0])
    to_float32(ref_model)
    step(0, 0)
    ref_lp, nll = [], 0.0
    for done, w in enumerate(windows, start=1):
        lp = _log_probs(ref_model, w)
        nll += _nll(lp, w)
        ref_lp.append(lp)
        step(0, done)
    ref_row.perplexity = math.exp(nll / positions)
    step(0, len(windows), f"{labels[0]}: perplexity {ref_row.perplexity:.3f} over {positions:,} positions (reference)")
    del ref_model

    rows = []
    for index, (source, label) in enumerate(zip(candidates, labels[1:]), start=1):
        model, tok = load(source)
        _check_same_reading(label, tok.encode(content)[: len(ids)] == ids, model.config.vocab_size, ref_vocab)
        row = _describe(model, label)
        to_float32(model)
        step(index, 0)
        nll = kl_sum = agree = 0.0
        kl_max = 0.0
        for done, (w, lp_ref) in enumerate(zip(windows, ref_lp), start=1):
            lp = _log_probs(model, w)
            if lp.shape[-1] != lp_ref.shape[-1]:
                _check_same_reading(label, True, lp.shape[-1], lp_ref.shape[-1])
            kl = (mx.exp(lp_ref) * (lp_ref - lp)).sum(axis=-1)
            same = (mx.argmax(lp_ref, axis=-1) == mx.argmax(lp, axis=-1)).sum()
            mx.eval(kl, same)
            kl_sum += kl.sum().item()
            kl_max = max(kl_max, kl.max().item())
            agree += same.item()
            nll += _nll(lp, w)
            step(index, done)
        row.perplexity = math.exp(nll / positions)
        row.kl_mean, row.kl_max, row.top1_agreement = kl_sum / positions, kl_max, agree / positions
        rows.append(row)
        summary = f"mean KL {row.kl_mean:.4f}, top-1 {row.top1_agreement:.1%}, perplexity {row.perplexity:.3f}"
        step(index, len(windows), f"{label}: {summary}")
        del model
    return QualityReport(
        text=path.name, tokens=len(ids), positions=positions, window=window, reference=ref_row, candidates=rows
    )


def _check_same_reading(label: str, same_ids: bool, vocab: int, ref_vocab: int) -> None:
    """A candidate must read the text as the reference's ids and score as many tokens, or no KL compares."""
    if not same_ids:
        raise MlxinferError(
            f"{label} tokenizes the text differently from the reference; compare models that share a tokenizer"
        )
    if vocab != ref_vocab:
        raise MlxinferError(
            f"{label} scores {vocab:,} tokens, the reference {ref_vocab:,}; compare models that share a vocabulary"
        )


def _log_probs(model: nn.Module, window: list[int]) -> mx.array:
    """(len - 1, V) float32 log-probabilities of the next token at every position but the last, through a
    KV cache as a prompt's prefill reads it (a pass without one takes the composed attention on the native
    paths, not the nodes the served numbers come from: on int8, top-1 96.6% where the served 96.9%)."""
    logits = model(mx.array([window]), cache=model.make_cache())[0, :-1].astype(mx.float32)
    check_scores(model, window, logits)  # NaN or inf: an error naming the first bad layer, not a NaN report
    lp = log_softmax(logits, model.info.cpu_kernels)  # as `tokens` reads it (MLX's CPU logsumexp ran ~1e-4 low)
    mx.eval(lp)
    return lp


def _nll(lp: mx.array, window: list[int]) -> float:
    targets = mx.array(window[1:])
    return -mx.take_along_axis(lp, targets[:, None], axis=-1).sum().item()


def _label(source) -> str:
    if is_embedded(source):
        return "embedded"
    return Path(str(source)).name or str(source)


def _describe(model: nn.Module, label: str) -> ModelQuality:
    nbytes = source_bytes(model)
    params = unpacked_parameter_count(model)
    return ModelQuality(
        name=label,
        weights=weights_summary(model),
        parameters=params,
        bytes=nbytes,
        bits_per_weight=8 * nbytes / params,
        perplexity=float("nan"),
    )


def weights_summary(model: nn.Module) -> str:
    """The common setting of the Linear/Embedding weights, then the modules that differ (HF names)."""
    from mlx.utils import tree_flatten

    float_dtype = next(
        (
            str(p.dtype).split(".")[-1]
            for n, p in tree_flatten(model.parameters())
            if mx.issubdtype(p.dtype, mx.floating) and not n.endswith((".scales", ".biases"))
        ),
        "float",
    )
    settings = {p: affine.setting_of(m) for p, m in affine.tables(model).items()}

    def text(s):
        return float_dtype if s is None else f"{s[1]}-bit g{s[0]}"

    counts: dict = {}
    for s in settings.values():
        counts[s] = counts.get(s, 0) + 1
    common = max(counts, key=lambda s: counts[s])
    tied = model.config.tie_word_embeddings
    others = [f"{_short(n, tied)} {text(s)}" for n, s in settings.items() if s != common]
    prefix = ""
    if model.info.source.kind == "gguf":  # llama.cpp's name for the file ("Q4_K - Medium"), then how it loads
        h = gguf.read_header(model.info.source.path, tokenizer=False)
        prefix = f"GGUF {ggml_types.file_type(h.metadata, {t.name: t.type_name for t in h.tensors})[1]}, as "
    if len(others) > MODULES_NAMED:  # a K-quant file mixes types layer by layer: the tables by setting
        by = sorted(counts.items(), key=lambda kv: -kv[1])
        return prefix + ", ".join(f"{text(s)} x{n}" for s, n in by) + " tables"
    return prefix + text(common) + ("; " + ", ".join(others) if others else "")


MODULES_NAMED = 4  # modules named one by one where their setting differs from the most common one


def _short(name: str, tied: bool) -> str:
    embed = "embedding/output table (tied)" if tied else "embedding table"
    return {"model.embed_tokens": embed, "lm_head": "output table"}.get(name, name)
