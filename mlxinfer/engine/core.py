"""The row core: every continuation in flight, whoever drives it.

A row is one continuation of a prompt: its sampler (sampler.RowSampler: the seed's key chain, the
penalties' history, the grammar mask), its token budget, its stop strings and its detokenizer. A
`Batch` holds the rows in flight and their KV caches and steps them all with one forward pass:

  groups      rows admitted from one prefill share a B-row cache and step through `model(...)`,
              one call per group (decode.py's rows; mlx-lm's classes and split models in the server)
  own caches  each row has a one-row cache of its own, and one layer walk (model/ragged.py) serves
              rows of any lengths together (the server's rows on our own definitions)

Every stop rule is here, once:

  stop    an end-of-turn token, a finished grammar, or a stop string in the text (the text is
          returned up to it; while the text so far could still be the start of one, it is held back)
  length  max_tokens (the context is checked against max_tokens when the request is prepared)
  error   the drawn token's own score is not finite (NaN or inf in the hidden state reaches every
          score; a bad row of the output table is caught by the prefill's check), or the row's
          grammar failed

The drivers: decode.py (generate, stream_generate, sample, sweep: one prompt, every step queued one
ahead) and batcher.py (the server: requests join and leave between steps). A driver asks a row to
`decide` on a token id as soon as it is drawn (which rows go on into the next pass), and to `take`
it (text, Steps) when it tells its caller; the two may be a step apart.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import mlx.core as mx

from ..model import ragged
from ..model.cache import fork, keep_rows
from ..model.native_block import shares_prefixes
from ..sampler import RowSampler, draw_batch
from ..settings import SamplerSettings
from ..views import Alternative, Step
from .constrain import JsonResult, finish


@dataclass
class RowSpec:
    """One continuation of the prompt: how it samples and when it stops."""

    seed: Optional[int] = None  # None: MLX's global random stream (seed it with mx.random.seed)
    settings: SamplerSettings = field(default_factory=SamplerSettings)
    max_tokens: int = 256
    mask: Any = None  # a constrain.GrammarMask for this row, or None
    stop: tuple[str, ...] = ()  # stop strings: the text ends before the first one
    after: tuple[int, ...] = ()  # a plain text's last tokens, which the row's text continues (continues())


@dataclass
class RowResult:
    """What one row wrote: its text, tokens, (optionally) its Steps, and how it ended."""

    text: str = ""
    tokens: list[int] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    finish_reason: Optional[str] = None
    stop_token: Optional[int] = None  # the end-of-turn token that stopped it, if one did

    @property
    def first_token(self) -> Optional[int]:
        """The first token drawn: an end-of-turn id when the row wrote nothing."""
        return self.tokens[0] if self.tokens else self.stop_token


class StopStrings:
    """Cut the text at the first stop string; hold back a tail only while it could begin one."""

    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.buffer = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text that is safe to show now, whether a stop string matched)."""
        self.buffer += text
        if not self.stops:
            out, self.buffer = self.buffer, ""
            return out, False
        hits = [i for i in (self.buffer.find(s) for s in self.stops) if i >= 0]
        if hits:
            out, self.buffer = self.buffer[: min(hits)], ""
            return out, True
        held = max((n for s in self.stops for n in range(1, len(s)) if self.buffer.endswith(s[:n])), default=0)
        cut = len(self.buffer) - held
        out, self.buffer = self.buffer[:cut], self.buffer[cut:]
        return out, False

    def flush(self) -> str:
        out, self.buffer = self.buffer, ""
        return out


def _shallow(obj):
    """copy.copy of a plain object (attributes in its __dict__), without copy's protocol: ~0.5 us, not ~2."""
    twin = object.__new__(type(obj))
    twin.__dict__.update(obj.__dict__)
    return twin


class Row:
    """One continuation in flight: its sampler, its stop rules, its text so far, and its KV cache
    (`cache`, a one-row cache of its own) or its place in a `group`."""

    def __init__(self, spec: RowSpec, history: mx.array, tokenizer, stop_ids: set[int], index: int, keep_steps=False):
        self.spec, self.index, self.keep_steps = spec, index, keep_steps
        self.sampler = RowSampler(spec.settings, spec.seed, history, spec.mask)
        self.detok = copy.copy(tokenizer.detokenizer)  # a streaming detokenizer of its own
        self.detok.reset()
        if spec.after:  # its text continues the prompt's: read those tokens first, then only what follows
            for token in spec.after:
                self.detok.add_token(token)
            if type(self.detok).__name__ != "NaiveStreamingDetokenizer":  # (it decodes its tokens whole, so
                self.detok.finalize()  # its text goes on from the prompt's; finalized it decodes afresh)
            _ = self.detok.last_segment
        self.stop_ids = stop_ids | (spec.mask.stop_ids if spec.mask is not None else set())
        self.stops = StopStrings(spec.stop)
        self.generated = 0  # tokens decided on (end-of-turn tokens are not counted)
        self.decoded = 0  # characters of text so far, before a stop string cut it
        self.token: Optional[int] = None  # the last token drawn: what the next pass reads
        self.cache: Optional[list] = None
        self.group: Optional[Group] = None
        self.result = RowResult()
        self.by_stop_string = False
        self.error: Optional[str] = None  # why the row ended in error
        self.owner: Any = None  # the driver's own handle (the server: the row's job)

    @property
    def ended(self) -> bool:
        return self.result.finish_reason is not None

    def clone(self) -> "Row":
        """A copy that goes on alone from here (the exact answers' walk branches a row this way): its own
        detokenizer, stop-string buffer and result; the spec, sampler and cache are shared, so a row with
        a grammar mask (which its tokens advance) cannot be cloned."""
        if self.spec.mask is not None:
            raise ValueError("a row with a grammar mask cannot be cloned: its mask advances with it")
        twin = _shallow(self)
        twin.detok = _shallow(self.detok)
        for name, value in vars(self.detok).items():  # its token lists (not a shared token map)
            if isinstance(value, list) and name != "tokenmap":
                setattr(twin.detok, name, list(value))
        twin.stops = _shallow(self.stops)
        r = self.result
        twin.result = RowResult(r.text, list(r.tokens), list(r.steps), r.finish_reason, r.stop_token)
        return twin

    def may_continue(self) -> bool:
        """Whether a token after the next could still be drawn (the budget allows it)."""
        return self.generated + 1 < self.spec.max_tokens

    def decide(self, token: int, finite: bool = True) -> Optional[str]:
        """The rules a token id settles at once: an end-of-turn token or a finished grammar ("stop"),
        the budget ("length"), scores that are not finite or a failed grammar ("error", said in
        `error`); None: the row goes on."""
        failure = self.sampler.failure()
        if failure is not None:
            self.error = f"constrained decoding failed: {failure}"
            return "error"
        if not finite:
            self.error = "the model's scores became NaN or inf during decode"
            return "error"
        if token in self.stop_ids:
            return "stop"
        self.generated += 1
        if self.spec.mask is not None and self.spec.mask.should_stop(token):
            return "stop"
        return "length" if self.generated >= self.spec.max_tokens else None

    def take(self, token: int, logprob: float, alternatives: list[Alternative], reason: Optional[str]) -> list[Step]:
        """The Steps `token` makes, given what `decide` said: its text (held back while it may begin a
        stop string), and when the row ends its last piece of text and the reason."""
        out, hit = [], False
        if reason == "error":
            return self._end([], "error", "", None)
        if token not in self.stop_ids:
            self.detok.add_token(token)
            segment = self.detok.last_segment  # reading it takes it: once
            shown, hit = self.stops.feed(segment)
            step = Step(token, shown, logprob, alternatives)
            step.offset = self.decoded
            self.decoded += len(segment)
            self.result.tokens.append(token)
            if self.keep_steps:
                self.result.steps.append(step)
            self.result.text += shown
            out.append(step)
            if hit:
                reason, self.by_stop_string = "stop", True
        if reason is None:
            return out
        self.detok.finalize()
        tail = ""
        if not hit:  # the detokenizer's last piece may complete a stop string too
            tail, hit = self.stops.feed(self.detok.last_segment)
            tail += self.stops.flush()
            if hit:
                reason, self.by_stop_string = "stop", True
        return self._end(out, reason, tail, token if token in self.stop_ids else None)

    def _end(self, out: list[Step], reason: str, tail: str, stop_token: Optional[int]) -> list[Step]:
        self.result.text += tail
        if tail and self.result.steps:  # the kept steps' texts join to the text: the last piece is the last token's
            last = self.result.steps[-1]  # a copy: the Step already handed out stays as it was streamed
            self.result.steps[-1] = replace(last, text=last.text + tail)
            self.result.steps[-1].offset = last.offset
        self.result.finish_reason, self.result.stop_token = reason, stop_token
        out.append(Step(None, tail, None, finish_reason=reason, stop_token=stop_token))
        return out

    def json(self) -> JsonResult:
        """A constrained row's end: its parsed JSON and whether it is complete (constrain.finish)."""
        r = self.result
        if self.by_stop_string:
            warning = "the output was cut at a stop string: it is NOT valid JSON; remove the stop string"
            return JsonResult(r.text, None, False, "stop", warning)
        return finish(self.spec.mask, r.text, r.tokens, r.finish_reason)


_NO_HISTORY = mx.array([], dtype=mx.int32)


def continues(prompt, chat: bool, ids: list[int]) -> tuple[int, ...]:
    """RowSpec.after: the prompt's last tokens where a row's text continues them (plain text or token ids:
    "The capital of France is" + " Paris", its leading space kept, so that a stop string " Paris" is met
    and prompt + text reads whole), none for a chat reply, which begins its own message (its leading
    space dropped, as mlx-lm's detokenizers drop the first one). Four: a character's bytes, and the
    token before a lone space, which the detokenizers hold back until they see what follows it."""
    ids_given = isinstance(prompt, (list, tuple)) and not all(isinstance(m, dict) for m in prompt)
    return tuple(ids[-4:]) if not chat or ids_given else ()


def replay(tokenizer, tokens, max_tokens: int, stop_ids: set[int], stop=(), mask=None, after=()) -> Row:
    """A row taken through `tokens` by the rules a draw follows (no sampling): its text so far, and whether
    and why it ended. The exact answers' walk reads paths this way; a resumed sweep checks its records."""
    spec = RowSpec(None, SamplerSettings(), max_tokens, mask, tuple(stop), tuple(after))
    row = Row(spec, _NO_HISTORY, tokenizer, stop_ids, 0)
    for token in tokens:
        row.take(token, 0.0, [], row.decide(token))
        if row.ended:
            break
    return row


class Group:
    """Rows from one prefill that share a B-row KV cache (their lengths are equal)."""

    def __init__(self, cache: list, members: list[Row]):
        self.cache, self.members = cache, members


@dataclass
class Drawn:
    """One draw for rows in flight (lazy until evaluated): tokens (A,), their log-probabilities (A,),
    each row's alternatives, and whether each drawn token's own score was finite (None: not checked)."""

    tokens: mx.array
    logprobs: mx.array
    alternatives: list
    finite: Optional[mx.array] = None

    def arrays(self) -> list:
        return [a for a in (self.tokens, self.logprobs, self.alternatives, self.finite) if a is not None]

    def keep(self, positions: list[int]) -> "Drawn":
        """Only these rows, in this order."""
        index = mx.array(positions, dtype=mx.int32)
        alts = [self.alternatives[p] for p in positions] if self.alternatives else self.alternatives
        finite = None if self.finite is None else self.finite[index]
        return Drawn(self.tokens[index], self.logprobs[index], alts, finite)


class Batch:
    """The rows in flight and their KV caches: `admit` rows from a prefill, `forward` them all one
    step, `draw` their next tokens, `keep` the ones that go on."""

    def __init__(self, model, tokenizer, *, own_caches: bool = False, keep_steps: bool = False):
        self.model, self.tokenizer, self.keep_steps = model, tokenizer, keep_steps
        self.own = own_caches and ragged.supports(model)
        self.shared = shares_prefixes(model)  # a group's rows hold their prompt once (cache.PrefixedCache)
        self.fast = model.info.cpu_kernels
        self.stop_ids = set(tokenizer.eos_token_ids)

    def admit(self, prefilled, specs: list[RowSpec], first_index: int = 0) -> list[Row]:
        """Rows continuing a prefilled prompt (decode.Prefilled), each with a copy of its cache."""
        history = mx.array(prefilled.ids[:-1], dtype=mx.int32)
        rows = [
            Row(spec, history, self.tokenizer, self.stop_ids, first_index + i, self.keep_steps)
            for i, spec in enumerate(specs)
        ]
        if self.own:
            for row in rows:
                row.cache = fork(prefilled.cache, 1)
        else:
            room = len(prefilled.ids) + max((s.max_tokens for s in specs), default=0)  # positions the rows can fill
            cache = fork(prefilled.cache, len(rows), room, self.shared)  # written in place (KVCache.owned)
            group = Group(cache, list(rows))
            for row in rows:
                row.group = group
        return rows

    def forward(self, rows: list[Row], tokens: mx.array) -> mx.array:
        """Scores (A, V) for the next token of each row, `tokens` (A,) being the tokens just drawn.
        A group's rows are contiguous in `rows`, in the group's order."""
        if self.own:
            # each row's cache is its own copy (cache.fork, KVCache.reserve), held by its Row alone
            return ragged.step(self.model, tokens, [r.cache for r in rows])
        out, at = [], 0
        for group in _groups(rows):
            n = len(group.members)
            part = tokens if n == len(rows) else tokens[at : at + n]
            out.append(self.model(part[:, None], cache=group.cache)[:, -1, :])
            at += n
        return mx.concatenate(out) if len(out) > 1 else out[0]

    def draw(
        self, rows: list[Row], logits: mx.array, fed, alternatives: int, logprobs: bool, host_draw: bool = False
    ) -> Drawn:
        """Each row's next token from its scores (A, V), or (1, V) a prefill's shared by all. `fed`:
        the tokens (A,) those scores followed (what penalties and masks read next)."""
        fed = [fed[p : p + 1] for p in range(len(rows))] if isinstance(fed, mx.array) else fed
        y, lp, alts = draw_batch([r.sampler for r in rows], logits, fed, alternatives, self.fast, logprobs, host_draw)
        finite = None  # a prefill's shared scores were checked whole (finite.check_scores)
        if logits.shape[0] == len(rows):
            finite = mx.isfinite(mx.take_along_axis(logits, y[:, None].astype(mx.int32), axis=-1)[:, 0])
        return Drawn(y, lp, alts, finite)

    def keep(self, before: list[Row], after: list[Row]) -> None:
        """The rows that go on. The others let go of their KV cache now: a finished row's result may be
        held long after (a Row and its Group refer to each other, so a group's cache otherwise lived until
        Python's cycle collector ran: gigabytes over a few batches of seeds). keep(rows, []): all go."""
        staying = {id(r) for r in after}
        leaving = [r for r in before if id(r) not in staying]
        if not self.own:
            for group in _groups(before):
                kept = [p for p, r in enumerate(group.members) if id(r) in staying]
                if len(kept) < len(group.members):
                    group.cache = keep_rows(group.cache, kept) if kept else None
                    group.members = [group.members[p] for p in kept]
        for row in leaving:
            row.cache = row.group = None


def _groups(rows: list[Row]) -> list[Group]:
    """The groups in the order their rows appear."""
    seen: dict[int, Group] = {}
    for r in rows:
        seen.setdefault(id(r.group), r.group)
    return list(seen.values())


def alternatives_of(tokenizer, top) -> list[Alternative]:
    """A row's best alternatives ((ids, logprobs), evaluated) as Alternatives, best first; a token the
    row could not draw (a grammar's mask, logprob -inf) is none."""
    ids, values = top[0].tolist(), top[1].tolist()
    best = sorted(((v, t) for v, t in zip(values, ids) if v > -math.inf), reverse=True)
    return [Alternative(t, tokenizer.decode([t]), v) for v, t in best]
