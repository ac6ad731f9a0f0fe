"""Which completions are the same answer: one rule for sample's tally, sweep's cells and the exact answers.

    first-word   the first word, case and punctuation folded: "Basil", "basil." and "Basil, of course"
                 are one answer, "basil" (the default)
    text         the whole text, stripped of surrounding space: "Basil" and "Basil." are two answers
    first-token  the first token drawn, as its text (a token that is part of a character decodes to U+FFFD,
                 as several others do: its id is added, "\ufffd #163", so that different tokens stay apart)

first-word is the default because the lessons' prompts ask for one word ("Answer with one word."), and a
model writes that word with or without a capital, a full stop or a few words after it within the token
budget: a learner counting herbs counts those as one answer. A text with no word in it ("", "...") is
its own answer. Every group keeps the raw texts it holds, with their counts or probabilities.
"""

from __future__ import annotations

import re
from typing import Callable, Optional

from .. import defaults
from ..errors import MlxinferError

GROUPS = ("first-word", "text", "first-token")
_WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*")  # letters and digits, with inner apostrophes and hyphens


def check_group(group: str) -> str:
    if group not in GROUPS:
        raise MlxinferError(f"group must be one of {', '.join(GROUPS)}, got {group!r}", "group")
    return group


def answer_key(text: str, first_token: Optional[int], group: str = defaults.ANSWER_GROUP, decode=None) -> str:
    """The answer `text` (whose first draw was `first_token`) counts as, under the rule `group`."""
    if group == "text":
        return text.strip()
    if group == "first-word":
        word = _WORD.search(text)
        return word.group(0).casefold() if word else text.strip()
    if decode is None or first_token is None:
        return text.strip()
    shown = decode(first_token)
    return f"{shown} #{first_token}" if "\ufffd" in shown else shown


def keyer(group: str, decode: Optional[Callable[[int], str]] = None) -> Callable[[str, Optional[int]], str]:
    """answer_key with the rule fixed and checked: (text, first token) -> the answer."""
    check_group(group)
    return lambda text, first_token: answer_key(text, first_token, group, decode)
