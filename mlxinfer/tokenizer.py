"""Tokenizers and chat templates.

A model directory's tokenizer loads through mlx-lm's tokenizer utilities
(transformers underneath, never with remote code); chat templates render in
transformers' sandboxed Jinja environment. A GGUF file carries its vocabulary,
merges, special tokens and chat template in metadata; we rebuild a Hugging Face
`tokenizers` BPE from them and serve it without transformers or mlx-lm
(gguf_tokenizer.py: the same ids, text and streamed segments, the template in the
same Jinja sandbox), so a GGUF model starts in a fraction of the time.

User text is plain text: a special token's name typed in a prompt or system message (`<|im_end|>`)
is encoded as the characters it is made of, so only the chat template emits control tokens;
`raw_special_tokens=True` parses them as the tokenizer would.
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
from pathlib import Path

from . import defaults
from .errors import MlxinferError, check_bool
from .formats.gguf import GGUFHeader
from .chat_template import TemplateTooLarge, budget, check_growth, route_transformers
from .formats.paths import check_side_files

# llama.cpp's pre-tokenizer names -> the regex that splits text into words before BPE
_GPT2_WORDS = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_QWEN2_WORDS = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_WORDS = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE = {
    "gpt2": (False, _GPT2_WORDS),
    "default": (False, _GPT2_WORDS),
    "smollm": (True, _GPT2_WORDS),  # single digits first, then GPT-2 words
    "starcoder": (True, _GPT2_WORDS),
    "qwen2": (False, _QWEN2_WORDS),
    "llama-bpe": (False, _LLAMA3_WORDS),
}
CONTROL, USER_DEFINED = 3, 4


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


def _quiet_transformers() -> None:
    """transformers warns about lengths we check ourselves (against the model's context)."""
    import mlx_lm  # noqa: F401  (first: it turns off transformers' "PyTorch was not found" advice on stderr)
    from transformers.utils import logging

    logging.set_verbosity_error()


def load_tokenizer(directory: Path, eos_token_ids: list[int] | None = None):
    """A model directory's tokenizer, wrapped by mlx-lm (streaming detokenizer, EOS set)."""
    from mlx_lm.tokenizer_utils import load as mlx_lm_load_tokenizer

    _quiet_transformers()

    if not any((directory / f).exists() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise MlxinferError(f"no tokenizer files in {directory}; add tokenizer.json (and tokenizer_config.json)")
    check_side_files(directory)
    route_transformers()  # the checkpoint's chat template renders in the bounded sandbox (chat_template.py)
    try:
        return mlx_lm_load_tokenizer(directory, {"trust_remote_code": False}, eos_token_ids=eos_token_ids)
    except Exception as e:  # transformers/tokenizers parsing the checkpoint's files: their problem, one line
        raise MlxinferError(
            f"the tokenizer in {directory} could not be loaded ({_first_line(e)}); re-download its tokenizer files"
        ) from None


def tokenizer_from_gguf(header: GGUFHeader, fast: bool = True):
    """Rebuild the tokenizer stored in a GGUF file's metadata (BPE vocabularies of the gpt2 kind).

    fast=True: a GGUFTokenizer (gguf_tokenizer.py) on the `tokenizers` library alone; fast=False:
    mlx-lm's TokenizerWrapper around transformers' PreTrainedTokenizerFast, which the fast one
    matches id for id (and hands anything else it is asked to)."""
    m = header.metadata
    kind, pre = m.get("tokenizer.ggml.model"), m.get("tokenizer.ggml.pre", "default")
    if kind != "gpt2":
        raise MlxinferError(
            f"{header.path}: GGUF tokenizer model {str(kind)[:40]!r} is not supported (only BPE 'gpt2')"
        )
    if not isinstance(pre, str) or pre not in _PRE:
        raise MlxinferError(
            f"{header.path}: GGUF pre-tokenizer {str(pre)[:40]!r} is not supported; "
            f"supported: {', '.join(sorted(_PRE))}"
        )
    tokens = m.get("tokenizer.ggml.tokens")
    types = m.get("tokenizer.ggml.token_type", [1] * len(tokens) if isinstance(tokens, list) else None)
    merges = m.get("tokenizer.ggml.merges")  # a byte-level BPE without them splits text into characters
    template = m.get("tokenizer.chat_template")
    broken = (
        "the vocabulary (tokenizer.ggml.tokens)"
        if not _all(tokens, str) or not tokens
        else "tokenizer.ggml.token_type"
        if not _all(types, int)
        else "tokenizer.ggml.merges"
        if not _all(merges, str) or not merges or not all(" " in line for line in merges)
        else "tokenizer.chat_template"
        if template is not None and not isinstance(template, str)
        else None
    )
    if broken:
        raise MlxinferError(f"{header.path}: GGUF metadata lacks a usable {broken}; use a GGUF file with its tokenizer")
    _check_gguf_tokenizer_fields(header, m, tokens, types)
    pairs = [tuple(line.split(" ", 1)) for line in merges]

    def build(how):
        try:
            return how(m, tokens, types, pairs, pre, template)
        except Exception as e:  # tokenizers/transformers refusing the metadata: the file's problem, one line
            raise MlxinferError(f"{header.path}: the tokenizer in its metadata is broken ({_first_line(e)})") from None

    if not fast:
        return build(_gguf_tokenizer)
    # what importing mlx-lm did for the tokenizer this replaces: transformers, when a later path
    # imports it (llguidance's table for constrained decoding), keeps its PyTorch advice to itself
    os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    return build(lambda *args: _gguf_tokenizer_fast(*args, compat=lambda: build(_gguf_tokenizer)))


def _check_gguf_tokenizer_fields(header, m: dict, tokens: list, types: list) -> None:
    """What the metadata says beside the vocabulary, each as a one-line error where it is wrong: a type
    per token (a short list split later specials into characters), the named ids within the vocabulary
    (an EOS past it stopped nothing, and convert copied it on), add_bos_token a true boolean."""

    def corrupt(wrong: str) -> MlxinferError:
        return MlxinferError(f"{header.path}: {wrong}; the file's tokenizer metadata is corrupt, re-download it")

    if len(types) != len(tokens):
        raise corrupt(f"tokenizer.ggml.token_type holds {len(types):,} types for {len(tokens):,} tokens")
    for name in ("bos", "eos", "eot", "unknown", "padding"):
        i = m.get(f"tokenizer.ggml.{name}_token_id")
        if i is not None and not _token_id(i, len(tokens)):
            raise corrupt(f"tokenizer.ggml.{name}_token_id {i!r:.40} is not an id of its {len(tokens):,} tokens")
    add_bos = m.get("tokenizer.ggml.add_bos_token")
    if add_bos is not None and not isinstance(add_bos, bool):
        raise corrupt(f"tokenizer.ggml.add_bos_token is {str(add_bos)[:40]!r}, not true or false")


def _gguf_backend(tokens: list, types: list, merges: list, pre: str):
    """The `tokenizers` BPE the metadata describes: vocabulary, merges, pre-tokenizer, added tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, ignore_merges=(pre == "llama-bpe"))
    tok = Tokenizer(bpe)
    split_digits, words = _PRE[pre]
    steps = [pre_tokenizers.Digits(individual_digits=True)] if split_digits else []
    steps += [
        pre_tokenizers.Split(Regex(words), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ]
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    tok.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    )
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL]
    )
    return tok


def _gguf_specials(m: dict, tokens: list) -> tuple[dict[str, str | None], list[int]]:
    """The named special tokens (bos, eos, unk, pad) and the ids that end a turn (eos, eot)."""

    def special(key):
        i = m.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if _token_id(i, len(tokens)) else None

    names = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "pad_token": "padding"}
    keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
    return {k: special(v) for k, v in names.items()}, [m[k] for k in keys if _token_id(m.get(k), len(tokens))]


def _gguf_tokenizer_fast(m: dict, tokens: list, types: list, merges: list, pre: str, template, compat):
    """The backend finished as PreTrainedTokenizerFast.__init__ finishes it (named special tokens the
    vocabulary lacks added as special, the BOS post-processor), wrapped without transformers."""
    from tokenizers import AddedToken, processors

    from .gguf_tokenizer import SPECIAL_NAMES, GGUFTokenizer

    tok = _gguf_backend(tokens, types, merges, pre)
    special, eos = _gguf_specials(m, tokens)
    added = {t.content for t in tok.get_added_tokens_decoder().values()}
    missing = []
    for name in SPECIAL_NAMES:
        t = special.get(name)
        if t is not None and t not in added and t not in missing:
            missing.append(t)
    if missing:
        tok.add_tokens([AddedToken(t, special=True) for t in missing])
    bos = special["bos_token"]
    add_bos = bool(m.get("tokenizer.ggml.add_bos_token", False)) and bos is not None
    single = f"{bos}:0 $A:0" if add_bos else "$A:0"
    pair = f"{single}{f' {bos}:1' if add_bos else ''} $B:1"
    tok.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=[(bos, tok.token_to_id(bos))] if add_bos else []
    )
    return GGUFTokenizer(tok, special, template, eos, compat)


def _gguf_tokenizer(m: dict, tokens: list, types: list, merges: list, pre: str, template: str | None):
    """mlx-lm's TokenizerWrapper around transformers' PreTrainedTokenizerFast (the reference)."""
    _quiet_transformers()
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
    from transformers import PreTrainedTokenizerFast

    tok = _gguf_backend(tokens, types, merges, pre)
    special, eos = _gguf_specials(m, tokens)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        chat_template=template,
        add_bos_token=bool(m.get("tokenizer.ggml.add_bos_token", False)),
        **special,
    )
    return TokenizerWrapper(hf, BPEStreamingDetokenizer, eos_token_ids=eos)


def _all(values, kind) -> bool:
    return isinstance(values, list) and all(isinstance(v, kind) and not isinstance(v, bool) for v in values)


def _token_id(i, n: int) -> bool:
    return isinstance(i, int) and not isinstance(i, bool) and 0 <= i < n


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


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
        messages = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": prompt}
        ]
    for m in messages:
        try:
            m["content"].encode("utf-8")
        except UnicodeEncodeError:
            name = "prompt" if m is messages[-1] or m["role"] != "system" else "system"
            raise MlxinferError(f"{name} is not valid UTF-8 text; pass it as UTF-8", name) from None
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
    specials = _special_tokens(tokenizer)
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
            f"the model's chat template failed to render ({_first_line(e)}); try chat=False", "chat=False"
        ) from None
    if not isinstance(text, str):
        raise MlxinferError("the model's chat template did not render text; try chat=False", "chat=False")
    return text


def _special_tokens(tokenizer) -> dict[str, int]:
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
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n]
    if bad:
        raise MlxinferError(f"prompt token ids must be whole numbers in 0..{n - 1}, got {bad[0]!r}", "prompt")
    return list(ids)
