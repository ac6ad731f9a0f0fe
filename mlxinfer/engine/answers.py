"""`answers`: every complete answer's exact probability under the settings a seed runs with, found by
walking the tree of tokens best-first instead of sampling it.

Each draw of `sample` is one path through a tree whose branches carry the sampler's probabilities (the
model's scores adjusted, tempered and cut: sampler.kept_probabilities). The walk expands the most probable
open paths first, a batch per forward pass: each path continues its parent's keys and values (a path
holds only its last token's, the prompt is prefilled once). A path ends by exactly the rules a row of
`sample` ends by (core.Row: an end-of-turn token, the grammar's end, a stop string, max_tokens), and an
answer's probability is the sum over the paths whose text it is. The remainder is the mass of the paths
not resolved: the open ones, and the branches too light to follow (below ε of their parent, ε chosen so
that they cost at most half of 1 - min_mass). It bounds every unlisted answer and what any listed one
could still gain. One walk serves several settings: each node's scores are computed once, and each
settings entry has its own probabilities and its own frontier ordered by them; the entries not yet done
take the next paths of a batch in turn, each its heaviest.
A cut (top-k, top-p, min-p, typical-p) makes the support finite, and then the walk can be complete.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import mlx.core as mx
import numpy as np

from .. import defaults
from ..errors import MlxinferError, check_whole, is_number
from ..model.dtype_rule import physical_ram_bytes
from ..model.finite import all_finite
from ..settings import SamplerSettings, resolve_each, settings_list
from ..views import AnswerPath, AnswersReport, ExactAnswer, SettingsMass
from .branching import branches, followed, next_probabilities
from .core import Row, replay
from .decode import check_pass_fits, check_progress, prefill
from .grouping import check_group, keyer
from .path_cache import PathRows, at_position
from .request import check_batch_size, prepare
from .results import Terminated

WAIT = 4  # taken paths that may wait for a pass of their length, in batches
DRAIN = 1024  # children taken at most per entry once a budget ends the walk (~20 us each: no pass, their text)
PATHS_SHOWN = 3  # token paths kept per answer
TEXTS_SHOWN = 20  # raw texts listed per grouped answer, the most probable (its probability counts them all)


@dataclass(eq=False)
class _Node:
    """A path from the prompt: its tokens, its probability under each settings entry, its parent, and once
    expanded its last token's keys and values, (layers, 2, K, E)."""

    path: tuple
    probs: np.ndarray  # (S,) float64
    parent: Optional["_Node"]
    kv: Any = None
    row: Any = None  # core.Row after the path: its text so far, whether it has ended
    taken: bool = False  # out of the frontiers (expanded, or being)


@dataclass(eq=False)
class _Siblings:
    """An expanded node's open children not yet taken, heaviest first: (tokens, their path probabilities (n, S))."""

    parent: _Node
    tokens: list
    probs: np.ndarray
    at: int = 0

    def mass(self) -> np.ndarray:
        return self.probs[self.at :].sum(axis=0)


@dataclass
class _Found:
    probs: np.ndarray
    paths: list = field(default_factory=list)  # (weight, tokens, step probabilities)


def answers(
    model,
    tokenizer,
    prompt: str | list[int],
    *,
    settings: Sequence[SamplerSettings | Mapping[str, Any]],
    max_tokens: int = defaults.MAX_TOKENS_SAMPLE,
    stop: str | Sequence[str] | None = None,
    min_mass: float = defaults.EXACT_MIN_MASS,
    max_nodes: int = defaults.EXACT_MAX_NODES,
    batch_size: Optional[int] = None,
    group: str = defaults.ANSWER_GROUP,
    chat: bool = True,
    system: Optional[str] = None,
    thinking: bool = False,
    json_schema: dict | str | None = None,
    tool: dict | str | None = None,
    raw_special_tokens: bool = False,
    progress: Optional[Callable[[int, list[float]], None]] = None,
    max_seconds: Optional[float] = None,
) -> AnswersReport:
    """The exact distribution of whole answers for each settings entry (each a SamplerSettings or a dict of
    the fields set, the rest from generation_config.json, as in sweep). The walk ends when every entry has
    min_mass of its probability resolved, when max_nodes paths have been expanded, after max_seconds (when
    given), when nothing is left open (complete: remainder 0), or at Ctrl-C; the report says which.
    progress(nodes, remainders) after each batch."""
    settings = settings_list(settings)
    check_walk(min_mass, max_nodes, group, max_seconds)
    check_progress(progress)
    size = defaults.ANSWERS_BATCH_SIZE if batch_size is None else check_batch_size(batch_size)
    request = prepare(
        model, tokenizer, prompt, max_tokens=max_tokens, json_schema=json_schema, tool=tool, chat=chat,
        system=system, thinking=thinking, raw_special_tokens=raw_special_tokens, stop=stop,
    )  # fmt: skip
    resolved = resolve_each(settings, model.info.generation_config)
    walk = AnswerWalk(model, tokenizer, request, resolved, min_mass, max_nodes, size, group, progress, max_seconds)
    try:
        while walk.step():
            pass
    except Terminated:  # SIGTERM under a sweep's handler: the command ends (exit 143), not only the walk
        raise
    except KeyboardInterrupt:
        walk.stopped = "interrupted"
    return walk.report(prompt)


def check_walk(
    min_mass: float, max_nodes: int, group: str = defaults.ANSWER_GROUP, max_seconds: Optional[float] = None
) -> None:
    """The walk's bounds and the grouping rule, checked (a front end calls this before a model loads)."""
    if not (is_number(min_mass) and 0 < min_mass <= 1):
        raise MlxinferError(f"min_mass must be in (0, 1] (1: walk until complete), got {min_mass!r}", "min_mass")
    check_whole(max_nodes, "max_nodes", 1, "a whole number, at least 1")
    if max_seconds is not None and not (is_number(max_seconds) and max_seconds > 0):
        raise MlxinferError(f"max_seconds must be a number of seconds > 0, got {max_seconds!r}", "max_seconds")
    check_group(group)


class _OutOfTime(Exception):
    """max_seconds spent in the prompt's prefill."""


class AnswerWalk:
    """The walk for one prepared request (request.prepare) and its resolved settings, a batch at a time:
    step() runs one batch's forward passes (False once the walk has ended: `stopped` says why), report()
    says what it found. The server runs its steps between decode steps (Batcher.call)."""

    def __init__(self, model, tokenizer, request, settings, min_mass, max_nodes, batch_size, group, progress=None,
                 max_seconds=None):  # fmt: skip
        if getattr(model.info, "sharding", None):
            raise MlxinferError(
                "answers runs in one process: run it without mlx.launch (in Python, load the model without a group)",
                "source",
            )
        self.model, self.tokenizer, self.request, self.settings = model, tokenizer, request, settings
        self.min_mass, self.max_nodes, self.batch_size, self.progress = min_mass, max_nodes, batch_size, progress
        self.max_seconds = max_seconds
        self.group, self.key_of = group, keyer(group, lambda t: tokenizer.decode([t]))
        S = len(settings)
        # a branch lighter than eps of its parent is not followed: over max_tokens levels they lose at most
        # (1 - min_mass) / 2 of each setting's mass, the other half is left for the open paths
        self.eps = (1.0 - min_mass) / (2 * request.max_tokens)
        self.started = time.perf_counter()
        mx.reset_peak_memory()
        self.open = np.zeros(S)  # mass of the paths in the frontier
        self.lost = np.zeros(S)  # mass of the branches not followed
        self.found: dict[tuple, _Found] = {}  # (final text, first token) -> what ends with it
        self.ended: set[tuple] = set()  # each resolved path's tokens as a draw records them (no stop token)
        self.resolved = np.zeros(S)  # (S,) the mass of the paths that ended: what min_mass asks of the walk
        self.frontiers: list[list] = [[] for _ in settings]  # per entry: (-its path probability, n, stamp, item)
        self.counter = itertools.count()
        self.nodes = self.passes = self.leaves = 0
        self.kv_bytes = 0
        self.stopped: Optional[str] = None
        self.P = len(request.ids)
        self.prompt = self.rows = self.root = None
        try:  # a budget that ends in the prompt's prefill (a long prompt, a busy server) ends the walk there
            self.prompt = prefill(model, request.ids, progress=self._prefill_clock if max_seconds else None)
        except _OutOfTime:
            self.lost[:] = 1.0  # nothing walked: the whole mass is the remainder
            self.stopped = "max_seconds"
            return
        self._check_room(at_position(self.prompt.cache, self.P - 1).nbytes)
        check_pass_fits(model, min(batch_size, max_nodes))
        self.rows = PathRows(self.prompt.cache, self.P)
        compiled = request.compiled
        self.stop_ids = set(tokenizer.eos_token_ids) | (set(compiled.table.eos_ids) if compiled is not None else set())
        self.root = _Node((), np.ones(S), None)
        self.root.row = self._replay(())
        self._expand_children([self.root], self.prompt.logits)

    def _prefill_clock(self, done: int, total: int) -> None:
        if done < total and time.perf_counter() - self.started >= self.max_seconds:
            raise _OutOfTime

    def _check_room(self, per_path: int) -> None:
        """A walk bounded by nothing it can reach (no max_seconds, and more paths than this machine's memory
        holds the keys and values of) is refused before it starts: it would end in swapping or the OOM
        killer, not at its bound. With max_seconds the time bounds it, and a huge max_nodes means "no limit"."""
        ram = physical_ram_bytes()
        if self.max_seconds is None and ram is not None and self.max_nodes * per_path > ram:
            raise MlxinferError(
                f"max_nodes {self.max_nodes:,} would keep up to {self.max_nodes * per_path / 1e9:,.1f} GB of keys "
                f"and values ({per_path / 1e3:,.1f} KB a path) and this machine has {ram / 1e9:,.1f} GB: at most "
                f"{ram // per_path:,} paths fit; lower it, or bound the walk's time with max_seconds",
                "max_nodes",
                "max_seconds",
            )

    # ------------------------------------------------------------------------- the walk
    def step(self) -> bool:
        """One batch of the heaviest open paths through the model; False once the walk has ended."""
        if self.stopped is not None:
            return False
        if self.min_mass < 1 and (self.resolved >= self.min_mass).all():  # what ended, not 1 - the open paths:
            # that drifts in float64's last bits (1e-16 resolved with nothing found), and 1 - min_mass under
            # float64's epsilon (1e-17) rounds to 1
            self.stopped = "min_mass"
        elif self.nodes >= self.max_nodes:
            self.stopped = "max_nodes"
            self._resolve_ended()
        elif self.max_seconds is not None and time.perf_counter() - self.started >= self.max_seconds:
            self.stopped = "max_seconds"
            self._resolve_ended()
        else:
            batch = self._next_batch()
            if not batch:  # nothing open is left: every path has ended
                self.open[:] = 0.0  # exactly (the running sum drifts in the last bits)
                resolved = (1.0 - self._unresolved() >= self.min_mass).all()
                # what was lost is eps's cuts (min_mass reached), or past BRANCHES children a node
                self.stopped = "complete" if not self.lost.any() else "min_mass" if resolved else "branches"
            else:
                self._expand_children(batch, self._forward(batch))
            if self.progress and batch:
                self.progress(self.nodes, self._unresolved().tolist())
        return self.stopped is None

    def _unresolved(self) -> np.ndarray:
        """(S,): each entry's remainder: its open paths and the branches not followed."""
        return self.open + self.lost

    def _push(self, item) -> None:
        """Into every entry's frontier where it has weight; a node or a siblings cursor is taken once, from
        whichever frontier reaches it first (the others skip it: lazy deletion)."""
        probs = item.probs if isinstance(item, _Node) else item.probs[item.at]
        stamp = item.at if isinstance(item, _Siblings) else -1
        for s in np.nonzero(probs > 0)[0]:
            heapq.heappush(self.frontiers[s], (-float(probs[s]), next(self.counter), stamp, item))
        self.open += item.probs if isinstance(item, _Node) else item.mass()

    def _pop(self, s: int):
        """The heaviest item for entry s not yet taken (None when its frontier is empty)."""
        frontier = self.frontiers[s]
        while frontier:
            _, _, stamp, item = heapq.heappop(frontier)
            if isinstance(item, _Node) and not item.taken or isinstance(item, _Siblings) and item.at == stamp:
                return item
        return None

    def _next_batch(self) -> list[_Node]:
        """The heaviest open paths of one length, up to batch_size, taken in turn by each entry that is not
        done (its remainder above 1 - min_mass), each from its own frontier. A forward pass runs paths of
        one length, so the paths taken wait by length until one length fills a batch (or WAIT batches'
        worth wait, or nothing is left to take); then a full length runs, or else the shortest (one entry, or
        a walk to the end: the fewest passes), or, for several entries short of min_mass 1, the length whose
        paths hold the most probability; the others go back to the frontiers. Children come out of their
        parent's siblings in order of weight; one that ends (an end-of-turn token, max_tokens, a stop string,
        the grammar's end) is resolved on the way, with no forward pass."""
        size = min(self.batch_size, self.max_nodes - self.nodes)
        waiting: dict[int, list[_Node]] = {}  # length -> paths taken
        weight: dict[int, float] = {}  # length -> the probability of its paths, each under the entry that took it
        turns = itertools.cycle(range(len(self.settings)))
        taken = idle = 0
        while max(map(len, waiting.values()), default=0) < size and taken < WAIT * size and idle < len(self.settings):
            s = next(turns)
            left = self.open[s] + self.lost[s]
            item = self._pop(s) if 1.0 - left < self.min_mass or not taken else None
            if item is None:
                idle += 1
                continue
            idle = 0
            if isinstance(item, _Node):
                item.taken = True
                self.open -= item.probs
                waiting.setdefault(len(item.path), []).append(item)
                weight[len(item.path)] = weight.get(len(item.path), 0.0) + float(item.probs[s])
                taken += 1
                continue
            self._take_child(item)
        if not waiting:
            return []
        if len(self.settings) == 1 or self.min_mass >= 1.0:  # every path runs in the end: the fewest passes
            full = [d for d, nodes in waiting.items() if len(nodes) >= size]
            depth = min(full or waiting)  # else the shortest: its children may fill the longer ones
        else:  # the length that resolves the most probability: a hot entry's many light paths filled every pass
            # and a cold one's few heavy ones never ran (T = 0.3 beside T = 1.5: nothing in 300 paths, alone 0.99)
            depth = max(sorted(waiting), key=lambda d: weight[d])
        batch = waiting[depth][:size]
        for node in waiting.pop(depth)[size:] + [n for nodes in waiting.values() for n in nodes]:
            node.taken = False  # back in the frontiers (its entries there are a lazily deleted copy at most)
            self._push(node)
        return batch

    def _take_child(self, item: _Siblings) -> None:
        """The heaviest child left in `item`: an answer where it ends, else an open path."""
        self.open -= item.mass()
        token, probs = item.tokens[item.at], item.probs[item.at]
        item.at += 1
        if item.at < len(item.tokens):
            self._push(item)
        row = self._follow(item.parent, token)
        if row.ended:
            self._leaf(item.parent, token, probs, row)
        else:
            self._push(_Node(item.parent.path + (token,), probs, item.parent, row=row))

    def _resolve_ended(self) -> None:
        """When a budget ends the walk: each entry's heaviest open children, in weight order, as long as they
        need no forward pass (an answer that ends, or a path that then waits), up to DRAIN of them. Without
        this a budget spent in one pass would list no answer at all."""
        for s in range(len(self.settings)):
            for _ in range(DRAIN):
                item = self._pop(s)
                if isinstance(item, _Node):  # it needs a pass: back where it was, in this entry's frontier only
                    heapq.heappush(self.frontiers[s], (-float(item.probs[s]), next(self.counter), -1, item))
                if not isinstance(item, _Siblings):
                    break
                self._take_child(item)

    # ------------------------------------------------------------------------- one forward pass
    def _forward(self, nodes: list[_Node]) -> mx.array:
        """Scores (B, V) after each path, all of one depth d: a B-row cache of the prompt and each path's
        first d - 1 tokens (their keys and values, kept by its ancestors), then its last token."""
        B, d = len(nodes), len(nodes[0].path)
        cache = self.rows.cache([self._ancestors(n) for n in nodes])
        tokens = mx.array([n.path[-1] for n in nodes], dtype=mx.int32)
        logits = self.model(tokens[:, None], cache=cache)[:, -1, :]  # (B, V)
        own = at_position(cache, self.P + d - 1)  # (B, layers, 2, K, E)
        mx.eval(logits, own)
        self.rows.keep(cache)
        for b, node in enumerate(nodes):
            node.kv = own[b]  # a view of `own`: stacked, a new array (one layer: a view, which no pass writes over)
        self.kv_bytes = own[0].nbytes
        self.nodes += B
        self.passes += 1
        if not all_finite(logits):
            raise MlxinferError(
                "the model's scores became NaN or inf on an answer's path; the walk was ended", "source"
            )
        return logits

    def _ancestors(self, node: _Node) -> list:
        chain, n = [], node.parent
        while n is not None and n.kv is not None:
            chain.append(n.kv)
            n = n.parent
        return chain[::-1]

    # ------------------------------------------------------------------------- a node's children
    def _expand_children(self, nodes: list[_Node], logits: mx.array) -> None:
        """Each node's children under every settings entry (branching.py): the heaviest up to BRANCHES that
        hold all but eps of every entry's conditional mass; the rest is lost to the remainder."""
        fast = self.model.info.cpu_kernels  # as the draws of `sample` on this model cut (sampler/row.py)
        arrays = next_probabilities(logits, [n.path for n in nodes], self.settings, self.request, fast)
        weights = np.stack([n.probs for n in nodes], axis=1)  # (S, B)
        ids, conds, support = branches(*arrays, weights)
        for b, node in enumerate(nodes):
            kept, cond, lost = followed(conds[b], support[:, b], self.eps)
            self.lost += node.probs * lost
            if len(kept):  # every child waits in weight order, ending ones too: resolved when taken
                probs = node.probs[None, :] * cond.T  # (n, S)
                order = np.argsort(-probs.max(axis=1), kind="stable")
                self._push(_Siblings(node, ids[b][kept[order]].tolist(), probs[order]))

    # ------------------------------------------------------------------------- ends
    def _follow(self, parent: _Node, token: int) -> Row:
        """The row after parent's path and `token`: parent's row taken one token further (a grammar's row,
        whose mask cannot be shared, is replayed from the start)."""
        if self.request.compiled is not None:
            return self._replay(parent.path + (token,))
        row = parent.row.clone()
        row.take(token, 0.0, [], row.decide(token))
        return row

    def _replay(self, path: tuple) -> Row:
        """The path through a row of the row core, as `sample` would run it: its text and whether it ended."""
        request = self.request
        mask = request.compiled.mask(request.vocab_size) if request.compiled is not None else None
        return replay(self.tokenizer, path, request.max_tokens, self.stop_ids, request.stop or (), mask, request.after)

    def _leaf(self, parent: _Node, token: int, probs: np.ndarray, row: Row) -> None:
        self.leaves += 1
        tokens = parent.path if token in self.stop_ids else parent.path + (token,)  # as a draw records them
        self.ended.add(tokens)
        first = tokens[0] if tokens else None  # first-token grouping keeps the same text's apart, as the tally
        found = self.found.setdefault((row.result.text, first), _Found(np.zeros_like(probs)))
        found.probs += probs
        self.resolved += probs
        found.paths.append((float(probs.max()), parent, token, probs))
        if len(found.paths) > 4 * PATHS_SHOWN:  # keep the heaviest few
            found.paths = sorted(found.paths, key=lambda p: -p[0])[:PATHS_SHOWN]

    # ------------------------------------------------------------------------- the report
    def report(self, prompt) -> AnswersReport:
        """What the walk found so far: the answers (grouped), each entry's explored mass and remainder."""
        group, key_of, stopped = self.group, self.key_of, self.stopped or "interrupted"
        seconds = time.perf_counter() - self.started
        grouped: dict[str, ExactAnswer] = {}
        heaviest: dict[str, list] = {}
        for (text, first), found in self.found.items():
            key = key_of(text, first)
            answer = grouped.setdefault(key, ExactAnswer(key, [0.0] * len(self.settings)))
            answer.probs = [a + b for a, b in zip(answer.probs, found.probs.tolist())]
            shown = answer.texts.get(text, [0.0] * len(self.settings))
            answer.texts[text] = [a + b for a, b in zip(shown, found.probs.tolist())]
            heaviest.setdefault(key, []).extend(found.paths)
        for key, answer in grouped.items():
            answer.paths = [self._path(p) for p in sorted(heaviest[key], key=lambda p: -p[0])[:PATHS_SHOWN]]
            texts = sorted(answer.texts.items(), key=lambda t: (-max(t[1]), t[0]))
            answer.texts, answer.texts_not_shown = dict(texts[:TEXTS_SHOWN]), max(0, len(texts) - TEXTS_SHOWN)
        listed = sorted(grouped.values(), key=lambda a: (-max(a.probs), a.answer))
        remainder = self._unresolved()
        if stopped == "interrupted":  # Ctrl-C may land while paths are taken and not yet resolved: then
            # open + lost misses them, and what no listed answer holds is the sound remainder
            remainder = np.maximum(remainder, 1.0 - self.resolved)
        remainder = np.clip(remainder, 0.0, 1.0)  # >= 0 but for float64's last bits
        masses = [
            SettingsMass(s.to_dict(), float(1.0 - r), float(r), bool(r == 0)) for s, r in zip(self.settings, remainder)
        ]
        report = AnswersReport(
            self.model.info.name, self.model.info.definition, prompt if isinstance(prompt, str) else "",
            self.request.ids, [s.to_dict() for s in self.settings], self.request.max_tokens,
            list(self.request.stop), group, listed, masses, stopped, self.nodes, self.passes, self.leaves,
            self.max_nodes, self.kv_bytes, self.nodes * self.kv_bytes, mx.get_peak_memory(), seconds,
        )  # fmt: skip
        report.min_mass, report.max_seconds, report.weights = self.min_mass, self.max_seconds, self.model.info.weights
        report.ended_paths = self.ended  # not data: which draws the walk's answers hold (summary.g_test)
        return report

    def _path(self, entry) -> AnswerPath:
        _, parent, token, probs = entry
        chain, n = [probs], parent
        while n is not None:
            chain.append(n.probs)
            n = n.parent
        chain = chain[::-1]  # the root's ones first
        steps = [(b / np.where(a > 0, a, 1)).tolist() for a, b in zip(chain, chain[1:])]
        tokens = list(parent.path) + [token]
        return AnswerPath(tokens, [self.tokenizer.decode([t]) for t in tokens], probs.tolist(), steps)
