"""The data each public function returns: tables, generations, experiment reports.

Plain dataclasses with `to_dict()` (what `--json` prints); nothing here prints or imports mlx.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


class View:
    def to_dict(self) -> dict:
        """The fields as plain data, strict JSON: a number that is not finite (-inf, NaN) is None, as
        `--json` prints it."""
        return finite(asdict(self))

    def _repr_pretty_(self, printer, cycle) -> None:
        """IPython and Jupyter show a result in brief: long lists as their length, long texts cut (repr()
        and to_dict() keep everything)."""
        from .brief import brief

        printer.text(brief(self))

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "_repr_pretty_" not in cls.__dict__:  # IPython looks in each class before its dataclass __repr__
            cls._repr_pretty_ = View._repr_pretty_


def finite(obj: Any):
    """obj as strict JSON's data: every float that is not finite as None, through dicts, lists, tuples and
    views (their to_dict())."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return finite(obj.to_dict()) if hasattr(obj, "to_dict") else obj


# ----------------------------------------------------------------------------- count
@dataclass
class CountReport(View):
    """Every figure `count` shows; the CLI only renders it. Parameters unless named otherwise."""

    model: str
    source: str  # config | gguf | hub
    config: dict
    rows: list[dict]  # the lesson's table: label, formula, params (None for a heading), indent
    embedding: int
    attention: int  # this and the next three: per layer
    mlp: int
    layer_norms: int
    layer: int
    num_layers: int
    layers: int  # num_layers x layer
    final_norm: int
    output_table: int  # 0 when tied
    total: int  # unique parameters
    dtype: str
    bytes_per_parameter: int
    bytes: int  # total x bytes_per_parameter
    shares: dict  # mlp_of_layer, attention_of_layer, layers_of_model, vocab_tables_of_model
    operations: dict  # per token
    context: dict | None = None  # --context
    answer: dict | None = None  # --answer-tokens
    hardware: dict | None = None  # --flops / --bandwidth
    quantization: dict | None = None  # MLX config block or GGUF tensor types
    stored: dict | None = None  # what the safetensors / GGUF headers say
    notes: list[str] = field(default_factory=list)
    experts: dict | None = None  # a mixture of experts: all stored, k of n active per token
    ranks: dict | None = None  # --ranks N: memory per rank when the model is split across N (counting/split.py)


# ----------------------------------------------------------------------------- one forward pass
@dataclass
class TokenRow(View):
    rank: int
    id: int
    text: str | None
    score: float
    probs: list[float]  # one per temperature, over the whole vocabulary
    logprob: float  # at temperature 1.0


@dataclass
class ExplainRow(View):
    rank: int
    id: int
    text: str | None
    score: float  # after the adjustments, before the temperature
    prob: float  # at the temperature, over the whole vocabulary, before the cut
    kept: bool
    final_prob: float  # after the cut, rescaled to 1 (0 when cut)
    # the probability top-p reads summed over this row and those above it (at T; untempered in mlx-lm's order),
    # None where a top-k cut comes first (top-p then reads the survivors rescaled)
    running: float | None = None


@dataclass
class Explanation(View):
    """One step of the sampler: which of the best tokens the cut keeps, and their rescaled probability."""

    settings: dict
    vocab_size: int
    n_kept: int
    mass_kept: float  # share of the temperature-T probability the cut keeps
    mass_cut: float
    rows: list[ExplainRow] = field(default_factory=list)


@dataclass
class ExpertChoice(View):
    """In one layer with a mixture of experts: the experts the last token's router chose, best first."""

    layer: int
    experts: list[int]
    weights: list[float]  # the router's weights for them (rescaled to sum to 1 where the model does so)


@dataclass
class NextTokenTable(View):
    """The lesson's table: the top-k next tokens by score, their probability at each temperature."""

    model: str
    prompt: str
    prompt_ids: list[int]
    n_scores: int  # one score per vocabulary entry
    temperatures: list[float]
    rows: list[TokenRow]
    mass: list[float]  # probability the k rows hold, per temperature
    settings_note: str = ""  # with an explanation: where the sampler's settings came from
    explanation: Explanation | None = None
    definition: str = ""  # which forward pass ran: "mlxinfer llama", "mlx-lm gemma3_text"
    weights: str = ""  # the compute path: how the weights are held, "4/8-bit quantized (activations float32)"
    routing: list[ExpertChoice] | None = None  # with an explanation, for our mixture-of-experts definition
    sharding: dict | None = None  # the model split across ranks: how, and each rank's bytes (model.info.sharding)

    def _repr_pretty_(self, printer, cycle) -> None:
        """In a notebook, the table itself (was: rows=[TokenRow(...), ...]: the numbers it exists for hidden)."""
        from .brief import token_table

        printer.text(token_table(self))


# ----------------------------------------------------------------------------- generation
@dataclass
class Alternative(View):
    id: int
    text: str
    logprob: float


@dataclass
class PromptToken(View):
    """One token of a prompt as the model read it (prompt_logprobs): None where nothing came before."""

    position: int
    id: int
    text: str
    logprob: float | None  # given the tokens before it, at temperature 1
    prob: float | None
    rank: int | None  # 1: the model's first guess at this position
    alternatives: list[Alternative]  # the model's best guesses here, by score


@dataclass
class PromptReading(View):
    """A prompt's tokens, each with the probability the model gave it, and the perplexity over them."""

    model: str
    definition: str
    prompt: str
    tokens: list[PromptToken]
    scored: int  # tokens with a probability: all but the first
    logprob: float  # their sum: the log-probability of the prompt after its first token
    perplexity: float | None  # exp(-logprob / scored); None for a one-token prompt
    first_guesses: int  # tokens that were the model's first guess


@dataclass
class Step(View):
    """One generated token, or (token None) the end of the run: text held back until then and the
    finish reason."""

    token: int | None
    text: str  # the new text this token completes (may be empty while a character is split)
    # log-probability of the token before temperature and cut (after penalties/mask); None on the final step
    logprob: float | None
    alternatives: list[Alternative] = field(default_factory=list)  # the K best, with logprobs=K
    finish_reason: str | None = None  # set on the final step: "stop" or "length" ("interrupted": Ctrl-C)
    stop_token: int | None = None  # on the final step: the end-of-turn token that stopped the run, if one did
    token_text: str | None = None  # with logprobs: the token's own text (`text` is what it completes)
    offset = 0  # not a field: characters of the row's text before this token's (the server's text_offset)


@dataclass
class Stats(View):
    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    prefill_tokens_per_s: float = 0.0
    generated_tokens: int = 0
    decode_seconds: float = 0.0
    decode_tokens_per_s: float = 0.0
    peak_memory_bytes: int = 0
    finish_reason: str = ""  # "stop" (end of turn, or the JSON closed), "length" (max_tokens) or "interrupted"


@dataclass
class Generation(View):
    model: str
    prompt_ids: list[int]
    text: str
    tokens: list[int]
    steps: list[Step]
    stats: Stats
    settings: dict
    settings_note: str
    seed: int | None  # what the draws came from; None at temperature 0 (greedy draws nothing) or MLX's global stream
    finish_reason: str
    # with json_schema or tool: the parsed JSON, whether it is complete and valid, and why not
    parsed: Any = None
    valid: bool | None = None
    warning: str = ""
    tool: str | None = None
    grammar_seconds: dict | None = None  # token table build, schema compile, and per step: mask, wait for it
    mask_steps: list[dict] | None = None  # explain_mask: what the grammar allowed at each step
    definition: str = ""  # which forward pass ran: "mlxinfer llama", "mlx-lm gemma3_text"
    sharding: dict | None = None  # the model split across ranks: how, and each rank's bytes (model.info.sharding)


# ----------------------------------------------------------------------------- experiments
@dataclass
class Completion(View):
    seed: int
    text: str
    tokens: list[int]
    finish_reason: str
    valid: bool | None = None  # with json_schema or tool: complete JSON of the schema's shape
    parsed: Any = None


@dataclass
class Tally(View):
    answer: str  # the answer as grouped (engine/grouping.py), e.g. "basil" under first-word
    count: int
    share: float
    texts: dict[str, int] = field(default_factory=dict)  # the raw texts it holds, with their counts
    exact: float | None = None  # with exact: the answer's exact probability (answers), a lower bound
    share_low: float | None = None  # with exact: the 95% Wilson interval of the share
    share_high: float | None = None


@dataclass
class SampleReport(View):
    model: str
    prompt: str
    prompt_ids: list[int]
    settings: dict
    settings_note: str
    completions: list[Completion] = field(default_factory=list)
    tally: list[Tally] = field(default_factory=list)
    batch_size: int = 1
    definition: str = ""  # which forward pass ran: "mlxinfer llama", "mlx-lm gemma3_text"
    sharding: dict | None = None  # the model split across ranks: how, and each rank's bytes (model.info.sharding)
    group: str = "first-word"  # which completions count as one answer
    exact: dict | None = None  # with exact: the walk's remainder and the G-test of the tally against it
    max_tokens: int = 0  # each completion's budget (its finish_reason "length" when reached)
    stop: list[str] = field(default_factory=list)  # the stop strings each completion ended at
    interrupted: str | None = None  # Ctrl-C during the draws: how many seeds finished (the report holds those)
    weights: str = ""  # the compute path (its scores, and so a seed's text, depend on it)


# ----------------------------------------------------------------------------- exact answers
@dataclass
class AnswerPath(View):
    """One token path to an answer: its tokens, their texts, its probability and each step's, per setting."""

    tokens: list[int]
    pieces: list[str]
    probs: list[float]  # the path's probability under each settings entry
    steps: list[list[float]]  # per token: its conditional probability under each settings entry


@dataclass
class ExactAnswer(View):
    answer: str  # as grouped
    probs: list[float]  # exact probability under each settings entry (of the paths walked: a lower bound)
    texts: dict[str, list[float]] = field(default_factory=dict)  # its most probable raw texts, with their probs
    paths: list[AnswerPath] = field(default_factory=list)  # the most probable ones
    texts_not_shown: int = 0  # raw texts it holds beyond those in `texts` (its probs count them all)


@dataclass
class SettingsMass(View):
    settings: dict
    explored: float  # probability resolved into listed answers
    remainder: float  # not resolved: bounds every unlisted answer and what a listed one could still gain
    complete: bool  # remainder exactly 0


@dataclass
class AnswersReport(View):
    model: str
    definition: str
    prompt: str
    prompt_ids: list[int]
    settings: list[dict]
    max_tokens: int
    stop: list[str]
    group: str
    answers: list[ExactAnswer]
    mass: list[SettingsMass]  # per settings entry
    stopped: str  # "complete", "min_mass", "branches", "max_nodes", "max_seconds" or "interrupted"
    nodes: int  # paths expanded (one forward row each)
    forward_passes: int
    leaves: int  # paths that ended
    max_nodes: int
    kv_bytes_per_node: int  # what an expanded path keeps: its last token's keys and values
    kv_bytes: int
    peak_memory_bytes: int
    seconds: float
    min_mass: float = 1.0  # the bounds it walked under
    max_seconds: float | None = None
    weights: str = ""  # the compute path (its scores, and so a seed's text, depend on it)


# ----------------------------------------------------------------------------- sweeps
@dataclass
class SweepRecord(View):
    """One completion of a sweep: a line of the results file."""

    prompt_index: int
    prompt: str
    prompt_sha256: str  # of the prompt's token ids (chat template included)
    settings_index: int
    settings: dict
    seed: int
    text: str
    tokens: list[int]
    finish_reason: str
    first_token: int  # the first token drawn (an end-of-turn id when the completion is empty)
    first_token_prob: float  # its probability under these settings: after temperature and cut
    exact_prob: float | None = None  # with exact: its answer's exact probability

    def to_dict(self, exact: bool = True) -> dict:
        """exact=False: without exact_prob (a results file's line, which gets it only from an exact sweep)."""
        out = finite(asdict(self))
        if not exact or self.exact_prob is None:
            out.pop("exact_prob")
        return out


@dataclass
class AnswerRow(View):
    answer: str
    count: int
    share: float
    share_low: float  # 95% Wilson interval of the share
    share_high: float
    first_token: int
    first_token_text: str
    # the model's probability of this answer's (most drawn) first token: its expected share only where the
    # answer is that token alone (group first-token); else `exact` is
    first_token_prob: float
    exact: float | None = None  # with exact: the answer's exact probability (answers)


@dataclass
class FirstTokenRow(View):
    """One first token of a cell's completions: observed share against the model's probability."""

    token: int
    text: str
    count: int
    share: float
    share_low: float  # 95% Wilson interval
    share_high: float
    prob: float  # the model's probability of it as the first draw under the cell's settings


@dataclass
class CellSummary(View):
    """One prompt under one setting: what came out, how often, against what the model predicts."""

    prompt_index: int
    prompt: str
    settings_index: int
    settings: dict
    draws: int
    answers: list[AnswerRow] = field(default_factory=list)
    first_tokens: list[FirstTokenRow] = field(default_factory=list)
    chi_square: float | None = None  # first tokens observed vs the model's probabilities
    dof: int | None = None
    p_value: float | None = None
    test_note: str | None = None  # why there is no chi-square test, where there is none
    exact: dict | None = None  # with exact: the walk's remainder and the G-test of the answers against it


@dataclass
class SweepReport(View):
    model: str
    definition: str
    out: str | None
    ranks: int
    completions: int  # in the results (resumed ones included)
    new_completions: int  # drawn by this run
    resumed: int  # already in the file
    tokens: int  # generated by this run
    seconds: float
    tokens_per_s: float
    batch_size: int
    cells: list[CellSummary] = field(default_factory=list)
    records: list[SweepRecord] = field(default_factory=list, repr=False)
    sharding: dict | None = None  # the model split across ranks: how, and each rank's bytes (model.info.sharding)
