"""What a sweep's completions say, per cell (one prompt under one setting): each answer's count and
share with a 95% Wilson interval, beside the model's own probability of the answer's first token
under those settings; and a chi-square test of the first tokens drawn against those probabilities.

The first token's probability is an answer's expected share only where the answer is that token alone
(group first-token); an answer of several tokens, or one the grouping folds from several first tokens,
expects less or more: `exact` (answers.py) gives its own probability. The chi-square test is over first
tokens, where the model gives exact probabilities. No mlx here; scipy gives the chi-square tail.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

from ..views import AnswerRow, CellSummary, FirstTokenRow

Z95 = 1.959963984540054  # the standard normal's 97.5% point
MIN_EXPECTED = 5  # first tokens expected fewer times than this are pooled into one bin
ROUNDING = 1e-6  # a mass below this left over from float32 probabilities is their rounding, not a bin


def wilson(count: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a share count / n (Wilson 1927): good at small n and near 0 or 1."""
    if n == 0:
        return 0.0, 1.0
    p = count / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if count == 0 else max(0.0, center - half)  # exactly: rounding leaves ~1e-18 there
    return low, 1.0 if count == n else min(1.0, center + half)


def first_token_test(counts: dict[int, int], probs: dict[int, float]) -> tuple[float, int, float] | None:
    """Pearson's chi-square of observed first tokens against the model's probabilities: (statistic, degrees
    of freedom, p-value). Tokens expected fewer than MIN_EXPECTED times, and every token never drawn, are
    pooled into one bin; None when fewer than two bins remain."""
    from scipy.stats import chi2

    n = sum(counts.values())
    rest = 1.0 - sum(probs.values())  # the tokens never drawn; float32 sums leave ~1e-7 of either sign
    bins, pooled_observed, pooled_expected = [], 0, n * rest if rest > ROUNDING else 0.0
    for token, observed in counts.items():
        expected = n * probs[token]
        if expected >= MIN_EXPECTED:
            bins.append((observed, expected))
        else:
            pooled_observed += observed
            pooled_expected += expected
    if pooled_expected > 0 or pooled_observed:
        bins.append((pooled_observed, pooled_expected))
    if any(probs[token] <= 0 for token in counts):  # drawn where the cut gives probability 0: rejected outright
        return math.inf, max(len(bins) - 1, 1), 0.0
    if len(bins) < 2:
        return None
    statistic = sum((o - e) ** 2 / e for o, e in bins)
    dof = len(bins) - 1
    return statistic, dof, float(chi2.sf(statistic, dof))


def exact_of(probs: dict[str, float], answer: str, remainder: float) -> float | None:
    """An answer's exact probability from a walk: None where the walk did not reach it and left a remainder
    (it is at most that); 0 only where the walk was complete."""
    return probs.get(answer, 0.0 if remainder <= 0 else None)


def walked_counts(draws, key_of, walk) -> tuple[dict[str, int], int]:
    """The draws ((text, tokens) each) counted by answer where the walk resolved their path, and how many fell
    on paths it did not reach: an answer's exact probability holds its walked paths alone, and the others
    belong with the remainder (an incomplete walk's answers would otherwise draw more than they expect)."""
    counts, unwalked = Counter(), 0
    for text, tokens in draws:
        if tuple(tokens) in walk.ended_paths:
            counts[key_of(text, tokens[0] if tokens else None)] += 1
        else:
            unwalked += 1
    return counts, unwalked


def g_test(counts: dict[str, int], exact: dict[str, float], remainder: float, n: int, unwalked: int = 0) -> dict:
    """The G-test (likelihood ratio) of observed answer counts against their exact probabilities:
    answers expected fewer than MIN_EXPECTED times, those never listed, the draws on paths the walk did not
    reach (walked_counts) and the walk's remainder are pooled as one "other" bin. {g, dof, p_value,
    other_observed, other_expected, note}; p_value None when fewer than two bins remain, and note says so."""
    from scipy.stats import chi2

    bins, other_o, other_e = [], unwalked, n * max(remainder, 0.0)
    for answer, p in exact.items():
        if n * p >= MIN_EXPECTED:
            bins.append((counts.get(answer, 0), n * p))
        else:
            other_o, other_e = other_o + counts.get(answer, 0), other_e + n * p
    other_o += sum(k for a, k in counts.items() if a not in exact)
    if other_o or other_e > 0:
        bins.append((other_o, other_e))
    out = {"other_observed": other_o, "other_expected": other_e, "g": None, "dof": None, "p_value": None, "note": None}
    if len(bins) < 2:
        note = f"no G-test: fewer than two groups expected {MIN_EXPECTED} or more times (the rest is pooled as other)"
        return {**out, "note": note}
    if any(e <= 0 < o for o, e in bins):  # drawn where the walk proved the probability 0: rejected outright
        return {**out, "g": math.inf, "dof": len(bins) - 1, "p_value": 0.0}
    g = 2 * sum(o * math.log(o / e) for o, e in bins if o > 0)
    return {**out, "g": g, "dof": len(bins) - 1, "p_value": float(chi2.sf(g, len(bins) - 1))}


def summarize(
    records: list[dict], prompts: list[str], settings: list[dict], decode, key_of, exact: dict | None = None
) -> list[CellSummary]:
    """One CellSummary per (prompt, settings) that has completions, in grid order; answers grouped by
    `key_of` (grouping.keyer). exact: (prompt, settings) -> its answers' exact distribution (answers.py)."""
    cells: dict[tuple[int, int], list[dict]] = defaultdict(list)
    for r in records:
        cells[r["prompt_index"], r["settings_index"]].append(r)
    out = []
    for (p, s), rows in sorted(cells.items()):
        n = len(rows)
        probs = {r["first_token"]: r["first_token_prob"] for r in rows}
        by_answer: dict[str, Counter] = defaultdict(Counter)
        for r in rows:
            by_answer[key_of(r["text"], r["tokens"][0] if r["tokens"] else None)][r["first_token"]] += 1
        answers = []
        for answer, firsts in sorted(by_answer.items(), key=lambda a: (-sum(a[1].values()), a[0])):
            count = sum(firsts.values())
            token = firsts.most_common(1)[0][0]
            low, high = wilson(count, n)
            answers.append(AnswerRow(answer, count, count / n, low, high, token, decode(token), probs[token]))
        firsts = Counter(r["first_token"] for r in rows)
        first_rows = [FirstTokenRow(t, decode(t), k, k / n, *wilson(k, n), probs[t]) for t, k in firsts.most_common()]
        cell = CellSummary(p, prompts[p], s, settings[s], n, answers, first_rows)
        test = first_token_test(firsts, probs)
        if test is not None:
            cell.chi_square, cell.dof, cell.p_value = test
            if math.isinf(test[0]):  # (JSON holds inf as null: the note says why p is 0)
                cell.test_note = "a first token was drawn that the cut gives probability 0: rejected outright"
        else:
            cell.test_note = (
                f"no chi-square test: fewer than two first-token groups expected {MIN_EXPECTED} or more times"
            )
        walk = (exact or {}).get((p, s))
        if walk is not None:
            probs_of = {a.answer: a.probs[0] for a in walk.answers}
            remainder = walk.mass[0].remainder
            for a in answers:
                a.exact = exact_of(probs_of, a.answer, remainder)
            counts, unwalked = walked_counts([(r["text"], r["tokens"]) for r in rows], key_of, walk)
            cell.exact = {
                "remainder": remainder,
                "stopped": walk.stopped,
                **g_test(counts, probs_of, remainder, n, unwalked),
            }
        out.append(cell)
    return out
