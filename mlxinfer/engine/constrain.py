"""Constrained decoding: a JSON Schema becomes a grammar mask in the sampler chain.

Before each draw, every token that would break the schema gets a score of -inf, so the
output always has the schema's shape; the values stay the model's choice. The grammar
engine is llguidance (Rust, with Python bindings): it builds a token table from the
Hugging Face tokenizer once, compiles the schema into a grammar, and for each step
computes a bitmask with one bit per vocabulary token. We unpack that bitmask with numpy
and apply it with a plain ``mx.where`` (llguidance's own MLX helper is a Metal kernel).

    compiled = compile_schema(tokenizer, schema)       # cached per (tokenizer, schema)
    mask = compiled.mask(model.config.vocab_size)       # one per generation
    RowSpec(..., mask=mask)                             # decode.py: one row, one mask

Rules the mask keeps:
* end-of-turn tokens are allowed only where the grammar accepts; once the grammar says
  nothing but the end can follow, the mask allows only them, so the next token stops the loop;
* control tokens never appear inside the JSON (llguidance never matches special tokens);
* rows of the model's output table beyond the tokenizer's vocabulary are always masked.

What overlaps with what (MLX evaluates lazily): the processor is called while
the decode loop builds the next step's graph. It reads the token just drawn (already
evaluated), hands "consume that token, compute the next bitmask" to a worker thread, and
starts the forward pass with ``mx.async_eval(logits)``; only then does it wait for the
mask and add the ``mx.where`` to the graph. llguidance and MLX's eval both release the
GIL, so the mask is computed while the pass runs: on Metal async_eval returns at once and
the main thread waits for the mask; on the CPU back end async_eval runs the pass in the
calling thread and the mask is ready when it returns. What does not overlap: the
``mx.where`` itself, and the sampler's draw, which need both the scores and the mask.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

import mlx.core as mx
import numpy as np

from ..errors import MlxinferError
from ..sampler import NEG_INF, apply_mask
from .schema import _one_line, check_object_schema, grammar_limits, parse_checked, validate_schema


# ----------------------------------------------------------------------------- the token table
@dataclass
class TokenTable:
    """llguidance's view of a tokenizer: every token's bytes, the EOS ids; built once per tokenizer."""

    ll: Any  # llguidance.LLTokenizer
    n_vocab: int
    eos_ids: list[int]
    build_seconds: float
    special_names: list[str] = field(default_factory=list)  # the control tokens' texts, e.g. <|im_end|>

    def decode(self, ids: list[int]) -> str:
        return self.ll.decode_str(list(ids))


_TABLES: "weakref.WeakKeyDictionary[Any, TokenTable]" = weakref.WeakKeyDictionary()


def token_table(tokenizer) -> TokenTable:
    """The llguidance token table of `tokenizer` (an mlx-lm TokenizerWrapper or a HF fast tokenizer)."""
    try:
        return _TABLES[tokenizer]
    except KeyError:
        pass
    import llguidance.hf

    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [hf.eos_token_id])
    start = time.perf_counter()
    try:
        ll = llguidance.hf.from_tokenizer(hf, n_vocab=len(hf), eos_token=eos)
    except ValueError as e:
        raise MlxinferError(f"constrained decoding needs a fast (Rust) Hugging Face tokenizer ({e})") from None
    specials = [ll.decode_str([i]) for i in range(ll.vocab_size) if ll.is_special_token(i)]
    table = TokenTable(ll, ll.vocab_size, list(ll.eos_tokens), time.perf_counter() - start, [s for s in specials if s])
    _TABLES[tokenizer] = table
    return table


# ----------------------------------------------------------------------------- compiling
@dataclass
class CompiledSchema:
    schema: dict
    grammar: str  # llguidance's grammar text
    table: TokenTable
    compile_seconds: float
    _pristine: Any = field(repr=False, default=None)  # an LLMatcher that has consumed nothing
    or_text: bool = False  # plain text is an answer too (schema.validate_schema)

    def matcher(self):
        """A fresh matcher at the start of the grammar (a copy: no recompilation)."""
        return self._pristine.deep_copy()

    def mask(self, vocab_size: Optional[int] = None, explain: bool = False) -> "GrammarMask":
        """A new logits processor for one generation; vocab_size = the model's output rows."""
        return GrammarMask(self, vocab_size or self.table.n_vocab, explain=explain)


# compiled schemas, the most recently used last: a server sees the same few schemas again and again, and
# a stream of distinct ones (one per request) must not grow the process without bound
_GRAMMARS: OrderedDict[tuple[int, str, bool], CompiledSchema] = OrderedDict()
# a hit's move and an insert's eviction are two steps each, and prepare may run on several threads
_GRAMMARS_LOCK = threading.Lock()
GRAMMAR_CACHE = 64
MAX_FORCED_BYTES = 16384  # more than this before the model's first choice: an endless prefix


def compile_schema(
    tokenizer, schema: dict, where: str = "json_schema", param: str = "json_schema", or_text: bool = False
) -> CompiledSchema:
    """Compile an object schema for this tokenizer; the last GRAMMAR_CACHE schemas used stay compiled.

    A feature the engine cannot express is a one-line MlxinferError here, before any
    forward pass.
    """
    from llguidance import LLMatcher

    check_object_schema(schema, where, param)
    table = token_table(tokenizer)
    key = (id(table), json.dumps(schema, sort_keys=True), or_text)
    with _GRAMMARS_LOCK:
        if key in _GRAMMARS:
            _GRAMMARS.move_to_end(key)
            return _GRAMMARS[key]
    clash = _control_token_text(schema, table.special_names)
    if clash:
        raise MlxinferError(
            f"{where}: the text {clash[1]!r} holds {clash[0]!r}, the name of a control token of this tokenizer, "
            "which the grammar engine would write as that token, not as text; rename it",
            param,
        )
    start = time.perf_counter()
    grammar = validate_schema(schema, where, param, or_text)  # checked without the tokenizer (cached)
    matcher = LLMatcher(table.ll, grammar, log_level=0, limits=grammar_limits())
    if matcher.is_error():
        raise MlxinferError(f"{where} cannot be compiled: {_one_line(matcher.get_error())}", param)
    # what the grammar forces from the start, as bytes (the mask works on bytes; as tokens, forced text
    # that spells a special token's name would be read as that control token): a schema with no finite
    # JSON is refused before (schema_bounds.py), but a pattern or a const can still fix a long text
    probe = matcher.deep_copy()
    forced = probe.compute_ff_bytes()
    if probe.is_error():
        raise _too_complex(where, param, probe.get_error())
    if len(forced) > MAX_FORCED_BYTES:
        raise MlxinferError(
            f"{where} fixes {len(forced):,} bytes of the output before the model makes any choice (a pattern, "
            f"const or required text that long); at most {MAX_FORCED_BYTES:,}: shorten it",
            param,
        )
    compiled = CompiledSchema(schema, grammar, table, time.perf_counter() - start, matcher, or_text)
    with _GRAMMARS_LOCK:
        _GRAMMARS[key] = compiled
        while len(_GRAMMARS) > GRAMMAR_CACHE:
            _GRAMMARS.popitem(last=False)
    return compiled


def _control_token_text(schema: Any, names: list[str]) -> Optional[tuple[str, str]]:
    """(control token name, text) for the first fixed text of the schema (a property name, an enum or
    const string) that spells a control token's name: llguidance tokenizes forced text with the
    tokenizer, which reads such a name as the control token itself."""
    stack = [schema]
    while stack and names:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            properties, enum, const = node.get("properties"), node.get("enum"), node.get("const")
            fixed = list(properties) if isinstance(properties, dict) else []
            fixed += enum if isinstance(enum, list) else []
            fixed.append(const)
            for text in fixed:
                hit = next((n for n in names if n in text), None) if isinstance(text, str) else None
                if hit:
                    return hit, text
            stack.extend(node.values())
    return None


def _too_complex(where: str, param: str | None, error: str) -> MlxinferError:
    return MlxinferError(
        f"{where} is beyond the grammar engine ({_one_line(error.split('<state>')[0], 160)}); simplify it",
        *([param] if param else []),
    )


# ----------------------------------------------------------------------------- the mask
_WORKER: Optional[ThreadPoolExecutor] = None


def _worker() -> ThreadPoolExecutor:
    """One thread for the masks: llguidance and MLX's eval both release the GIL, so the mask
    is computed while the forward pass runs on either back end."""
    global _WORKER
    if _WORKER is None:
        _WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlxinfer-mask")
    return _WORKER


def allowed_from_bitmask(bitmask: np.ndarray, n_table: int, vocab_size: int) -> np.ndarray:
    """llguidance's int32 bitmask (bit t of word t // 32 = token t) -> bool (vocab_size,).

    Token ids from n_table up (rows of the output table the tokenizer never produces) are False.
    """
    bits = np.unpackbits(np.ascontiguousarray(bitmask).reshape(-1).view(np.uint8), bitorder="little")
    allowed = np.zeros(vocab_size, dtype=bool)
    n = min(n_table, vocab_size)
    allowed[:n] = bits[:n]
    return allowed


@dataclass
class MaskStep:
    """One row of --explain-mask: what the grammar allowed before this step's draw."""

    step: int
    text: str  # written so far
    n_allowed: int
    chosen_id: int = -1  # the token drawn (-1: the end of the turn)
    chosen_text: str = ""
    allowed_id: int = -1  # the best token the grammar allows, and its score
    allowed_text: str = ""
    allowed_score: float = NEG_INF
    refused_id: int = -1  # the best token the grammar refused, and its score
    refused_text: str = ""
    refused_score: float = NEG_INF
    _lazy: Any = field(default=None, repr=False)

    def resolve(self, table: TokenTable) -> "MaskStep":
        if self._lazy is not None:
            a, av, r, rv = (x.item() for x in self._lazy)
            self._lazy = None
            self.allowed_id, self.allowed_score = int(a), float(av)
            self.allowed_text = table.decode([self.allowed_id])
            if rv > NEG_INF:
                self.refused_id, self.refused_score = int(r), float(rv)
                self.refused_text = table.decode([self.refused_id])
        return self

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


class GrammarMask:
    """A logits processor ``(tokens_so_far (N,), logits (1, V)) -> logits`` for one generation.

    The first call sees the prompt and remembers its length; each later call first feeds
    the tokens drawn since into the matcher, then masks. Not reusable across generations:
    ask ``CompiledSchema.mask()`` for a new one.
    """

    def __init__(self, compiled: CompiledSchema, vocab_size: int, explain: bool = False):
        from llguidance.numpy import allocate_token_bitmask

        if vocab_size < compiled.table.n_vocab:
            raise MlxinferError(f"the model scores {vocab_size} tokens but the tokenizer has {compiled.table.n_vocab}")
        self.compiled, self.table, self.vocab_size = compiled, compiled.table, vocab_size
        self.matcher = compiled.matcher()
        self.tokens: list[int] = []  # generated tokens the matcher has consumed
        self._prompt_len: Optional[int] = None
        self._checked = 0  # tokens seen by should_stop
        self._bitmask = allocate_token_bitmask(1, self.table.n_vocab)
        self.explain = explain
        self.steps: list[MaskStep] = []
        self.mask_seconds: list[float] = []  # per step: consume the last token, bitmask, unpack
        self.wait_seconds: list[float] = []  # per step: how long the loop waited for the mask

    @property
    def stop_ids(self) -> set[int]:
        """The end-of-turn ids the grammar allows where it accepts (the decode loop stops on them)."""
        return set(self.table.eos_ids)

    # -- feeding the matcher
    def _consume(self, token: int) -> None:
        if not self.matcher.consume_token(int(token)):
            self._schema_error()
            raise RuntimeError(f"the grammar refused token {token} that the mask allowed: {self.matcher.get_error()}")
        self.tokens.append(int(token))

    def _schema_error(self) -> None:
        """The parser gave up on the schema's size mid-way (llguidance's item limits): the schema's fault."""
        error = self.matcher.get_error()
        if "parser error" in error:
            raise _too_complex("the schema", None, error)

    def advance(self, generated: list[int]) -> None:
        """Feed the tokens of `generated` (all tokens drawn so far) that the matcher has not seen."""
        if generated[: len(self.tokens)] != self.tokens:
            raise RuntimeError("a GrammarMask serves one generation; make a new one with CompiledSchema.mask()")
        for token in generated[len(self.tokens) :]:
            if token in self.stop_ids and self.matcher.is_accepting():
                break
            self._consume(token)

    def allowed(self) -> np.ndarray:
        """The bool (vocab_size,) mask for the next token in the current state."""
        from llguidance.numpy import fill_next_token_bitmask

        fill_next_token_bitmask(self.matcher, self._bitmask)  # drops the GIL
        if self.matcher.is_error():
            self._schema_error()
            raise RuntimeError(f"grammar error: {self.matcher.get_error()}")
        return allowed_from_bitmask(self._bitmask, self.table.n_vocab, self.vocab_size)

    # -- the processor
    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        n = tokens.shape[0]
        new: list[int] = []
        if self._prompt_len is None:
            self._prompt_len = n
        elif n > self._prompt_len + len(self.tokens):
            # the ids drawn since the last call; evaluating them touches only the token history
            new = tokens[self._prompt_len + len(self.tokens) :].tolist()
        job = _worker().submit(self._next_mask, new)  # the CPU work: consume, bitmask, unpack
        mx.async_eval(logits)  # start the forward pass (on Metal this returns at once; on the
        wait = time.perf_counter()  # CPU back end it runs here, with the GIL released)
        allowed = job.result()
        self.wait_seconds.append(time.perf_counter() - wait)
        if self.explain:
            self._record(logits, mx.array(allowed), int(allowed.sum()))
        return apply_mask(logits, allowed)

    def _next_mask(self, new: list[int]) -> np.ndarray:
        start = time.perf_counter()
        if new:
            self.advance(self.tokens + new)
        allowed = self.allowed()
        self.mask_seconds.append(time.perf_counter() - start)
        return allowed

    def _record(self, logits: mx.array, keep: mx.array, n_allowed: int) -> None:
        row = logits.reshape(-1).astype(mx.float32)
        on, off = mx.where(keep.reshape(-1), row, NEG_INF), mx.where(keep.reshape(-1), NEG_INF, row)
        a, r = mx.argmax(on), mx.argmax(off)
        lazy = (a, on[a], r, off[r])  # evaluated with the step, read when the table is shown
        self.steps.append(MaskStep(len(self.steps), self.table.decode(self.tokens), n_allowed, _lazy=lazy))

    # -- where the grammar stands
    def should_stop(self, token: int) -> bool:
        """Called once per drawn token, in order: True when the grammar is finished after it,
        i.e. nothing but the end of the turn can follow (a hook for the generation loop)."""
        self._checked += 1
        if len(self.tokens) < self._checked:
            self.advance(self.tokens + [token])
        return self.is_finished()

    def is_finished(self) -> bool:
        """Nothing but the end can follow: the JSON is complete."""
        return self.matcher.is_stopped() and not self.matcher.is_error()

    def is_accepting(self) -> bool:
        return self.matcher.is_accepting()

    def explained(self) -> list[MaskStep]:
        """The --explain-mask rows, with the token each step drew (call after the run).

        The loop queues one step ahead, so a step may have been prepared after the end of
        the turn was drawn; it is dropped here.
        """
        del self.steps[len(self.tokens) + 1 :]
        for i, s in enumerate(self.steps):
            s.resolve(self.table)
            if i < len(self.tokens):
                s.chosen_id, s.chosen_text = self.tokens[i], self.table.decode([self.tokens[i]])
        return self.steps


# ----------------------------------------------------------------------------- the result
@dataclass
class JsonResult:
    text: str
    parsed: Any
    valid: bool
    finish_reason: str  # "stop" (the JSON closed) or "length" (cut: not valid)
    warning: str = ""
    text_answer: bool = False  # or_text: the answer is plain text, not the JSON (parsed None, valid False)

    def to_dict(self) -> dict:
        return asdict(self)


def finish(mask: GrammarMask, text: str, tokens: list[int], finish_reason: str) -> JsonResult:
    """Check the generated text against the grammar: complete, or cut by the token budget.

    A run whose last allowed token closed the JSON exactly at the budget is complete:
    its finish reason becomes "stop" (the grammar allowed nothing but the end).
    """
    mask.advance([t for t in tokens if t >= 0])
    if mask.compiled.or_text and not text.startswith("{"):
        return JsonResult(text, None, False, finish_reason, text_answer=True)
    complete = mask.is_finished() or (finish_reason == "stop" and mask.is_accepting())
    if complete:
        try:
            parsed, problem = parse_checked(text, mask.compiled.schema)
        except json.JSONDecodeError as e:  # the grammar guarantees JSON; this is a bug
            raise RuntimeError(f"the grammar accepted text that is not JSON ({e}): {text!r}") from None
        if problem:  # the grammar's rules are looser than the schema's in a few places: said, never "valid"
            return JsonResult(text, parsed, False, "stop", f"the JSON does not match the schema: {problem}")
        return JsonResult(text, parsed, True, "stop")
    warning = (
        f"the output was cut at the token limit after {len(tokens)} tokens: it is NOT valid JSON "
        "and does not match the schema; raise max_tokens"
    )
    return JsonResult(text, None, False, "length", warning)
