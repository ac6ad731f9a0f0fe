"""Prompts into token ids: text, chat messages through the model's chat template, or ids as given.

Chat templates render in transformers' sandboxed Jinja environment, bounded in time and size
(chat_template.py). User text is plain text: a special token's name typed in a prompt or system message
(`<|im_end|>`) is encoded as the characters it is made of, so only the chat template emits control tokens;
`raw_special_tokens=True` parses them as the tokenizer would. tokenizer_load.py loads the tokenizers.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import secrets
import sys
import time
from contextlib import contextmanager

from . import defaults
from .chat_template import TemplateTooLarge, budget, check_growth
from .errors import MlxinferError, check_bool, first_line, is_utf8, is_whole


def vocabulary(tokenizer) -> str:
    """A fingerprint of the tokenizer's vocabulary (every token with its id), computed once a tokenizer:
    `load` keeps its tokenizer's in the model's info, and a call given another model's tokenizer is told."""
    cached = getattr(tokenizer, "_mlxinfer_vocabulary", None)
    if isinstance(cached, str):
        return cached
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    text = json.dumps(sorted((i, t) for t, i in vocab.items()), ensure_ascii=False)
    cached = f"{len(vocab)} tokens, {hashlib.sha256(text.encode()).hexdigest()[:16]}"
    try:
        tokenizer._mlxinfer_vocabulary = cached
    except AttributeError:  # a tokenizer that takes no attributes is fingerprinted each time
        pass
    return cached


def system_message(prompt) -> dict | None:
    """The system message among chat messages (None for text, token ids, or messages without one)."""
    if not isinstance(prompt, (list, tuple)):
        return None
    return next((m for m in prompt if isinstance(m, dict) and m.get("role") == "system"), None)


def encode_prompt(
    tokenizer,
    prompt: str | list[int] | list[dict],
    *,
    chat: bool = True,
    system: str | None = None,
    thinking: bool = False,
    raw_special_tokens: bool = False,
    context: int | None = None,
) -> list[int]:
    """The token ids the model reads: the prompt wrapped in the chat template, or plain text.
    Token ids (a list of ints) are taken as they are, checked against the vocabulary; a list of chat
    messages ({"role", "content"} dicts: a conversation so far) is rendered by the template as it is,
    with `system` first when the messages hold no system message.

    A special token's name in the prompt or system text (`<|im_end|>`) is encoded as plain text,
    so that only the template emits control tokens; raw_special_tokens=True parses it instead.
    context: a text far past it is refused before it is encoded whole (`_check_not_far_over`)."""
    for name, value in (("chat", chat), ("thinking", thinking), ("raw_special_tokens", raw_special_tokens)):
        check_bool(value, name)
    if system is not None and not isinstance(system, str):
        raise MlxinferError(f"system must be text or None, got {type(system).__name__}", "system")
    if hasattr(prompt, "ndim") and hasattr(prompt, "tolist"):  # a numpy or MLX array of ids, as mlx-lm takes them
        if prompt.ndim != 1:
            raise MlxinferError(
                f"prompt token ids must be one row (1-D), got an array of shape {tuple(prompt.shape)}", "prompt"
            )
        prompt = prompt.tolist()
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
        messages = _checked_messages(prompt)
        if system is not None and system_message(messages) is not None:  # was: system= dropped
            raise MlxinferError("system is given twice: as system and as a system message; drop one", "system")
        if system is not None:
            messages.insert(0, {"role": "system", "content": system})
        if not chat:
            raise MlxinferError("chat messages need the chat template; pass chat=True, or the text alone", "prompt")
    elif isinstance(prompt, (list, tuple)):
        if system is not None:  # was: dropped without a word
            raise MlxinferError(
                "system is a message of the chat template, and token ids are read as they are; put it in the ids, "
                "or pass the prompt as text",
                "system",
            )
        return _checked_ids(tokenizer, prompt)
    elif not isinstance(prompt, str):
        raise MlxinferError(f"prompt must be text, token ids or chat messages, got {type(prompt).__name__}", "prompt")
    elif not prompt or (chat and not prompt.strip()):  # a table or a reply for the template alone, as the CLI
        # says; plain text of white space is text to continue (OpenAI's completions take it)
        raise MlxinferError(
            "prompt is empty" + (" (only white space)" if prompt else "") + "; give some text", "prompt"
        )
    else:
        _check_not_templated(tokenizer, prompt, chat, raw_special_tokens)
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": prompt}
        ]
    for m in messages:
        if not is_utf8(m["content"]):
            name = "prompt" if m is messages[-1] or m["role"] != "system" else "system"
            raise MlxinferError(f"{name} is not valid UTF-8 text; pass it as UTF-8", name)
    if context is not None:
        _check_not_far_over(tokenizer, [m["content"] for m in messages], context, raw_special_tokens)
    if not chat:
        if system:
            raise MlxinferError(
                "system is a message of the chat template, which chat=False skips; drop one of the two",
                "system",
                "chat=False",
            )
        if thinking:
            raise MlxinferError(
                "thinking is a switch of the chat template, which chat=False skips; drop one of the two",
                "thinking",
                "chat=False",
            )
        return tokenizer.encode(prompt) if raw_special_tokens else _plain(tokenizer, prompt, True)
    if getattr(tokenizer, "chat_template", None) is None:
        raise MlxinferError(
            "this model has no chat template; pass chat=False to feed the prompt as plain text", "chat=False"
        )
    text = _render(tokenizer, messages, thinking)
    if not text.strip():  # was: "--prompt is empty", about a prompt that was not
        raise MlxinferError(
            "the model's chat template rendered nothing for these messages; pass chat=False", "chat=False"
        )
    if thinking and text == _render(tokenizer, messages, False):
        raise MlxinferError(
            "thinking does nothing here: this model's chat template renders the same with and without it "
            "(Qwen3's has the switch); drop thinking",
            "thinking",
        )
    specials = control_tokens(tokenizer)
    pattern = re.compile("|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)))
    if raw_special_tokens or not specials or not any(pattern.search(m["content"]) for m in messages):
        return tokenizer.encode(text, add_special_tokens=False)
    return _encode_as_text(tokenizer, messages, thinking, text, specials, pattern)


ROLES = ("system", "user", "assistant", "tool")


def _checked_messages(messages) -> list[dict]:
    """Copies of the messages, each a role this toolkit knows and text content, or a one-line error."""
    if len(messages) > defaults.MAX_MESSAGES:
        raise MlxinferError(f"prompt: at most {defaults.MAX_MESSAGES:,} chat messages, got {len(messages):,}", "prompt")
    out = []
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise MlxinferError(f"prompt message {i}: role must be one of {', '.join(ROLES)}, got {role!r}", "prompt")
        if not isinstance(content, str):
            raise MlxinferError(f"prompt message {i}: content must be text, got {type(content).__name__}", "prompt")
        out.append({"role": role, "content": content})
    return out


class _TemplateTimeout(BaseException):
    """Past the render's CPU deadline; a BaseException so that no `except Exception` in Jinja (its
    compile-time constant folding runs filters and swallows what they raise) can keep the render going."""


def _jinja_folder() -> str:
    import jinja2

    return os.path.dirname(jinja2.__file__) + os.sep


_JINJA = _jinja_folder()


@contextmanager
def _deadline(seconds: float):
    """Stop a chat template that runs past `seconds` of this thread's CPU time: Jinja compiles templates to
    Python code (filename '<template>'), so a trace function on those frames alone sees every line they run,
    however they loop, and costs nothing elsewhere. CPU time, not the clock: a template that loops burns it,
    while a busy machine that leaves this thread waiting does not count against it."""
    end, lines = time.thread_time() + seconds, itertools.count()

    def line(frame, event, arg):
        if time.thread_time() > end:
            raise _TemplateTimeout
        if next(lines) % 256 == 0:
            check_growth()  # what the template has built, however it built it
        return line

    def call(frame, event, arg):  # the template's frames, and Jinja's filters and runtime that it calls
        name = frame.f_code.co_filename
        return line if name == "<template>" or name.startswith(_JINJA) else None

    previous = sys.gettrace()
    sys.settrace(call)
    try:
        yield
    finally:
        sys.settrace(previous)


def _render(tokenizer, messages: list[dict], thinking: bool) -> str:
    try:
        with _deadline(defaults.TEMPLATE_SECONDS), budget(messages):
            text = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True, enable_thinking=thinking
            )
    except TemplateTooLarge as e:
        raise MlxinferError(
            f"the model's chat template builds {e} (text multiplied without end?); fix the template, or pass "
            "chat=False",
            "chat=False",
        ) from None
    except _TemplateTimeout:
        raise MlxinferError(
            f"the model's chat template did not finish rendering within {defaults.TEMPLATE_SECONDS:g} s of CPU time "
            "(a loop without end?); fix the template, or pass chat=False",
            "chat=False",
        ) from None
    except Exception as e:  # a template error is the checkpoint's problem, not a bug here
        raise MlxinferError(
            f"the model's chat template failed to render ({first_line(e)}); try chat=False", "chat=False"
        ) from None
    if not isinstance(text, str):
        raise MlxinferError("the model's chat template did not render text; try chat=False", "chat=False")
    return text


def _check_not_templated(tokenizer, prompt: str, chat: bool, raw_special_tokens: bool) -> None:
    """A text that opens with a control token's name and holds another was rendered by a chat template
    already (mlx-lm's `apply_chat_template(..., tokenize=False)`, then the string): the template would wrap
    it again as a user message holding the template's text, and the model answer that."""
    if not chat or raw_special_tokens:
        return
    specials, head = control_tokens(tokenizer), prompt.lstrip()
    opener = next((t for t in specials if head.startswith(t)), None)
    # a template opens a turn and closes or begins another: a question about one token opens with it alone
    if opener is not None and sum(prompt.count(t) for t in specials) >= 2:
        raise MlxinferError(
            f"the prompt opens with {opener}, a control token's name: it looks rendered by a chat template "
            "already, which would wrap it again; pass the text alone (or the messages), or chat=False with "
            "raw_special_tokens=True to read it as written",
            "prompt",
            "chat=False",
            "raw_special_tokens=True",
        )


def control_tokens(tokenizer) -> dict[str, int]:
    """The tokenizer's special (control) tokens by text: what the template may emit and user text may not."""
    added = _inner(tokenizer, "added_tokens_decoder") or {}
    return {t.content: i for i, t in added.items() if getattr(t, "special", False) and t.content}


def _inner(tokenizer, name: str):
    """`name` of the tokenizer (mlxinfer's GGUF one answers itself; mlx-lm's wrapper hands it to
    transformers'), else of the tokenizer it wraps (`_tokenizer`), else None."""
    value = getattr(tokenizer, name, None)
    return value if value is not None else getattr(getattr(tokenizer, "_tokenizer", None), name, None)


def token_bytes(tokenizer, token: int) -> bytes:
    """The bytes a token stands for: a byte-level token may hold part of a character, which its text
    decoded alone shows as U+FFFD (OpenAI's logprobs `bytes` exist to rebuild such characters). Read from
    the detokenizer's map: byte-level BPE's alphabet, SentencePiece's pieces (bytes, with its space
    mark); else the token's text."""
    from .gguf_tokenizer import _byte_decoder

    detok = tokenizer.detokenizer
    pieces = getattr(detok, "tokenmap", None)
    if pieces is not None and 0 <= token < len(pieces):
        piece, kind = pieces[token], type(detok).__name__
        if kind.startswith("BPE") and isinstance(piece, str) and all(c in _byte_decoder() for c in piece):
            return bytes(_byte_decoder()[c] for c in piece)
        if kind.startswith("SPM") and isinstance(piece, bytes):
            return piece.replace("\u2581".encode(), b" ")
    return tokenizer.decode([token]).encode("utf-8")


def _check_not_far_over(tokenizer, texts: list[str], context: int, raw: bool) -> None:
    """Texts whose tokens pass `context` are refused before they are encoded whole (a megabyte took
    seconds, on the one thread the server encodes prompts on): a long text's prefixes are encoded,
    4 x context characters first, then twice as many, until their tokens pass the context (less 64
    for a word the cut splits into more tokens than it has whole) or the next prefix is the text."""
    total = 0
    for text in texts:
        n, counted = 4 * context, 0
        while n < len(text):
            head = text[:n]  # encoded as the prompt is: a special token's name is one token where raw
            ids = tokenizer.encode(head, add_special_tokens=False) if raw else _plain(tokenizer, head, False)
            counted = max(0, len(ids) - 64)
            if total + counted > context:
                raise MlxinferError(
                    f"the prompt is more than {context:,} tokens in its first {n:,} characters, and the model's "
                    f"context is {context:,}; shorten the prompt",
                    "prompt",
                )
            n *= 2
        total += counted


def _plain(tokenizer, text: str, add_special_tokens: bool) -> list[int]:
    """`text` encoded with every special token's name taken as the characters it is made of."""
    ids = tokenizer.encode(text, add_special_tokens=add_special_tokens, split_special_tokens=True)
    backend = _inner(tokenizer, "backend_tokenizer")
    if backend is not None:
        backend.encode_special_tokens = False  # transformers leaves its switch set for the next caller
    return list(ids)


def _encode_as_text(tokenizer, messages, thinking, text, specials: dict[str, int], pattern) -> list[int]:
    """Render again with each special token in the messages hidden behind a mark, split the result at
    the special tokens the template emitted (the only ones left), and encode the text between them
    (the marks put back) with special tokens taken as plain text."""
    nonce, found = secrets.token_hex(4), []

    def hide(m: re.Match) -> str:
        found.append(m.group())
        return f"\ue000{nonce}:{len(found) - 1}\ue001"

    skeleton = _render(tokenizer, [{**m, "content": pattern.sub(hide, m["content"])} for m in messages], thinking)
    mark = re.compile(f"\ue000{nonce}:(\\d+)\ue001")

    def restore(piece: str) -> str:
        return mark.sub(lambda m: found[int(m.group(1))], piece)

    if restore(skeleton) != text:
        raise MlxinferError(
            "the prompt or system text holds the name of a special token, which this chat template "
            "transforms; remove it, or pass raw_special_tokens=True to send it as a control token",
            "raw_special_tokens",
        )
    ids, at = [], 0
    for m in pattern.finditer(skeleton):
        ids += _plain(tokenizer, restore(skeleton[at : m.start()]), False) + [specials[m.group()]]
        at = m.end()
    return ids + _plain(tokenizer, restore(skeleton[at:]), False)


def _checked_ids(tokenizer, ids) -> list[int]:
    n = len(tokenizer)
    bad = [t for t in ids if not is_whole(t) or not 0 <= t < n]
    if bad:
        raise MlxinferError(f"prompt token ids must be whole numbers in 0..{n - 1}, got {bad[0]!r}", "prompt")
    return list(ids)
