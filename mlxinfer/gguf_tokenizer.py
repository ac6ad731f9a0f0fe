"""A GGUF file's tokenizer on the `tokenizers` library alone: no transformers, no mlx-lm at start-up.

`GGUFTokenizer` holds the same `tokenizers.Tokenizer` that transformers' PreTrainedTokenizerFast
would hold for the file (the same BPE, pre-tokenizer, added tokens and post-processor) and answers
what the rest of mlxinfer asks of a tokenizer the way mlx-lm's TokenizerWrapper around that
PreTrainedTokenizerFast answers it: encode, decode, the chat template (rendered in Jinja's
immutable sandbox, set up as transformers sets it up), the EOS ids and a streaming detokenizer
(mlx-lm's BPE one, same segments). tests/test_gguf_tokenizer.py holds the two side by side.

Anything else (`tokenizer._tokenizer`, which constrained decoding and the exporter hand to
llguidance and `save_pretrained`, or an attribute this class does not define) is answered by
that very mlx-lm TokenizerWrapper, built from the same metadata on first use: the slow imports are
paid only by the paths that need them.
"""

from __future__ import annotations

import copy
import functools
import sys
from typing import Any, Callable

from .chat_template import render, route_transformers

# named special tokens in transformers' order (SPECIAL_TOKENS_ATTRIBUTES); a GGUF names four of them
SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")
# apply_chat_template's own parameters (not template variables) and the message fields it renames
_HF_CHAT_OPTIONS = frozenset(
    "tools documents chat_template continue_final_message sanitize_control_tokens padding truncation max_length "
    "return_tensors return_dict return_assistant_tokens_mask tokenizer_kwargs".split()
)
_XTML = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
THINK_TOKENS = (("<think>", "</think>"), ("<longcat_think>", "</longcat_think>"), ("<|think:start|>", "<|think:end|>"))


class GGUFTokenizer:
    """A `tokenizers.Tokenizer` with what mlxinfer reads from a tokenizer (see the module docstring)."""

    def __init__(
        self,
        backend,
        special: dict[str, str | None],
        chat_template: str | None,
        eos_token_ids: list[int],
        compat: Callable[[], Any],
    ):
        self._backend = backend
        self._special = {k: v for k, v in special.items() if v is not None}  # bos_token: "<|im_start|>", ...
        self.chat_template = chat_template
        self.has_chat_template = chat_template is not None
        self._compat_factory, self._compat = compat, None
        self._eos_token_ids = set(eos_token_ids)
        if self.eos_token_id is not None:
            self._eos_token_ids.add(self.eos_token_id)
        self._detokenizer = None

        def known(*names: str) -> bool:  # in the vocabulary, added tokens included
            return all(backend.token_to_id(t) is not None for t in names)

        self._think_start, self._think_end = next(((a, b) for a, b in THINK_TOKENS if known(a, b)), (None, None))
        if self._think_start is None and (known("<|channel>", "<channel|>") or known(*_XTML)):
            self._think_start = ""  # a multi-token thinking mode: mlx-lm's wrapper describes it (see has_thinking)

    # ------------------------------------------------------------------------------ the slow twin
    @property
    def _tokenizer(self):
        """transformers' PreTrainedTokenizerFast for the same file (built, with its imports, on first use)."""
        return self._wrapper()._tokenizer

    def _wrapper(self):
        if self._compat is None:
            self._compat = self._compat_factory()
            route_transformers()  # its templates render in the bounded sandbox too
        return self._compat

    @property
    def __class__(self):
        """mlx-lm's TokenizerWrapper once mlx-lm is imported (before, nothing can ask), so that
        mlx-lm's generate and friends take this tokenizer as their own wrapper, as they took the
        one it replaces, instead of wrapping it again (with another detokenizer and EOS set).
        type() still names this class; what they read that is not here comes from that wrapper."""
        utils = sys.modules.get("mlx_lm.tokenizer_utils")
        return GGUFTokenizer if utils is None else getattr(utils, "TokenizerWrapper", GGUFTokenizer)

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self._wrapper(), name)

    # ------------------------------------------------------------------------------ ids and text
    def encode(self, text, add_special_tokens: bool = True, split_special_tokens: bool = False, **kwargs) -> list[int]:
        if kwargs or not isinstance(text, str):  # pairs, padding, tensors, ...: transformers' own encode
            return self._tokenizer.encode(
                text, add_special_tokens=add_special_tokens, split_special_tokens=split_special_tokens, **kwargs
            )
        backend = self._backend
        backend.encode_special_tokens = bool(split_special_tokens)
        try:
            return backend.encode(text, add_special_tokens=add_special_tokens).ids
        finally:
            backend.encode_special_tokens = False

    def __call__(self, *args, **kwargs):
        return self._tokenizer(*args, **kwargs)

    def decode(self, token_ids, skip_special_tokens: bool = False, **kwargs) -> str | list[str]:
        if kwargs:  # clean_up_tokenization_spaces and the like: transformers' own decode
            return self._tokenizer.decode(token_ids, skip_special_tokens=skip_special_tokens, **kwargs)
        ids = _plain_ids(token_ids)
        if isinstance(ids, int):
            ids = [ids]
        if ids and isinstance(ids[0], (list, tuple)):
            return [self._backend.decode(list(seq), skip_special_tokens=skip_special_tokens) for seq in ids]
        return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def __len__(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=False)

    def get_vocab(self) -> dict[str, int]:
        return self._backend.get_vocab(with_added_tokens=True)

    @property
    def backend_tokenizer(self):
        return self._backend

    @property
    def added_tokens_decoder(self) -> dict:
        return self._backend.get_added_tokens_decoder()

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self._token_id(tokens)
        return [self._token_id(t) for t in tokens]

    def _token_id(self, token: str):
        i = self._backend.token_to_id(token)
        return i if i is not None else self.unk_token_id

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        if isinstance(ids, int):
            return self._backend.id_to_token(ids)
        if skip_special_tokens:
            return self._tokenizer.convert_ids_to_tokens(ids, skip_special_tokens=True)
        return [self._backend.id_to_token(int(i)) for i in ids]

    # ------------------------------------------------------------------------------ special tokens
    @property
    def special_tokens_map(self) -> dict[str, str]:
        return dict(self._special)

    def _special_id(self, name: str):
        token = self._special.get(name)
        return None if token is None else self._token_id(token)

    bos_token = property(lambda self: self._special.get("bos_token"))
    eos_token = property(lambda self: self._special.get("eos_token"))
    unk_token = property(lambda self: self._special.get("unk_token"))
    pad_token = property(lambda self: self._special.get("pad_token"))
    bos_token_id = property(lambda self: self._special_id("bos_token"))
    eos_token_id = property(lambda self: self._special_id("eos_token"))
    pad_token_id = property(lambda self: self._special_id("pad_token"))

    @property
    def unk_token_id(self):
        token = self._special.get("unk_token")
        return None if token is None else self._backend.token_to_id(token)

    @property
    def eos_token_ids(self) -> set[int]:
        return self._eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, value) -> None:
        self._eos_token_ids = set(value) if value is not None else set()

    @property
    def has_thinking(self) -> bool:
        return self._think_start is not None

    # ------------------------------------------------------------------------------ the chat template
    def apply_chat_template(self, conversation, *args, tokenize: bool = True, **kwargs):
        """mlx-lm's TokenizerWrapper.apply_chat_template over transformers': the template gets the
        messages, add_generation_prompt, the named special tokens and the other keywords
        (enable_thinking defaulting to whether the vocabulary has a thinking mode)."""
        kwargs.setdefault("enable_thinking", self.has_thinking)
        add_generation_prompt = kwargs.pop("add_generation_prompt", False)
        if args or not self._plain_chat(conversation, kwargs):  # tools, documents, batches, ...: transformers
            return self._wrapper().apply_chat_template(
                conversation, *args, tokenize=tokenize, add_generation_prompt=add_generation_prompt, **kwargs
            )
        text = render(
            self.chat_template,
            [dict(m) for m in conversation],
            tools=None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **{**self._special, **kwargs},
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def _plain_chat(self, conversation, kwargs: dict) -> bool:
        """One conversation of plain-string messages, keywords of plain values, none of transformers'
        own options: what needs none of transformers' preparation (the rest goes to it)."""
        if not isinstance(self.chat_template, str) or type(conversation) is not list or not conversation:
            return False
        if any(k in _HF_CHAT_OPTIONS or type(v) not in (str, bool, int, float) for k, v in kwargs.items()):
            return False
        return all(
            type(m) is dict
            and all(type(k) is str and type(v) is str for k, v in m.items())
            and not any(k in m for k in _REASONING_FIELDS)
            for m in conversation
        )

    # ------------------------------------------------------------------------------ streaming
    @property
    def detokenizer(self) -> "BPEStreamingDetokenizer":
        """A streaming detokenizer of the caller's own (mlx-lm's BPEStreamingDetokenizer, reset)."""
        if self._detokenizer is None:
            n = len(self)
            self._detokenizer = BPEStreamingDetokenizer([self._backend.id_to_token(i) for i in range(n)])
        detokenizer = copy.copy(self._detokenizer)
        detokenizer.reset()
        return detokenizer


def _plain_ids(ids):
    """Token ids as Python ints and lists (numpy and mlx arrays, numpy scalars), as transformers' to_py_obj."""
    if hasattr(ids, "tolist") and not isinstance(ids, (list, tuple, int)):
        return ids.tolist()
    if isinstance(ids, (list, tuple)):
        return [_plain_ids(i) for i in ids] if any(not isinstance(i, int) for i in ids) else list(ids)
    return ids


# ---------------------------------------------------------------------------------- streaming text
@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: printable character -> the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, n = {chr(b): b for b in printable}, 0
    for b in range(256):
        if b not in table.values():
            table[chr(256 + n)] = b
            n += 1
    return table


class BPEStreamingDetokenizer:
    """mlx-lm's BPEStreamingDetokenizer (tokenizer_utils.py), step for step: text is released when
    its bytes form whole characters, a lone space waits for the next token, the leading space of
    the first text is dropped. Its quirks are kept, so the segments are the ones mlx-lm gives."""

    def __init__(self, tokenmap: list[str]):
        self.tokenmap = tokenmap
        self.reset()

    def reset(self) -> None:
        self.offset = 0
        self._unflushed = ""
        self.text = ""
        self.tokens = []

    @property
    def last_segment(self) -> str:
        """The text since the last time this was read."""
        text = self.text
        segment = text[self.offset :]
        self.offset = len(text)
        return segment

    def _decode_bytes(self, seq: str) -> str:
        byte_decoder = _byte_decoder()
        barr = bytearray()
        for c in seq:
            res = byte_decoder.get(c, False)
            if res:  # (byte 0 is falsy: mlx-lm appends its character's UTF-8 instead; kept)
                barr.append(res)
            else:
                barr.extend(bytes(c, "utf-8"))
        return barr.decode("utf-8", "replace")

    def _maybe_trim_space(self, current_text: str) -> str:
        if len(current_text) == 0 or current_text[0] != " ":
            return current_text
        return current_text if self.text else current_text[1:]

    def add_token(self, token: int) -> None:
        self.tokens.append(token)
        v = self.tokenmap[token] if token < len(self.tokenmap) else "!"  # mlx-lm's fallback past the vocabulary
        self._unflushed += v
        text = self._decode_bytes(self._unflushed)
        if not text.endswith("\ufffd") and not (len(v) == 1 and _byte_decoder().get(v[0]) == 32):
            self.text += self._maybe_trim_space(text)
            self._unflushed = ""

    def finalize(self) -> None:
        byte_decoder = _byte_decoder()
        current_text = bytearray(byte_decoder[c] for c in self._unflushed).decode("utf-8", "replace")
        self.text += self._maybe_trim_space(current_text)
        self._unflushed = ""
