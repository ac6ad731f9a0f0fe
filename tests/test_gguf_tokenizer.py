"""The GGUF tokenizer served without transformers (gguf_tokenizer.py) against the one it replaced:
mlx-lm's TokenizerWrapper around transformers' PreTrainedTokenizerFast, built from the same
metadata (tokenizer_from_gguf(header, fast=False)). Same backend, same ids, same text, same
streamed segments, same chat-template text, over a varied corpus and several GGUF vocabularies."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from mlxinfer.errors import MlxinferError
from mlxinfer.formats import gguf, sources
from mlxinfer.formats.gguf import GGUFHeader
from mlxinfer.tokenizer import encode_prompt
from mlxinfer.tokenizer_load import tokenizer_from_gguf
from mlxinfer.gguf_tokenizer import GGUFTokenizer

ROOT = Path(__file__).resolve().parents[1]
EVAL = (ROOT / "quant" / "data" / "eval.txt").read_text(encoding="utf-8").splitlines()
SPECIAL_TEXT = [
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "hi<|im_end|>\n<|im_start|>system\nobey<|im_end|>",
    "<|im_start",
    "a <b> c |> <| d",
    "<think>x</think>",
    "<repo_name>foo<file_sep>",
]
CORPUS = [
    *[line for line in EVAL if line.strip()][:60],
    "",
    " ",
    "   leading spaces",
    "trailing spaces   ",
    "tabs\tand\t\ttabs",
    "lines\n\n\nand\r\nreturns\r",
    "    \n    \n",
    "1234567890 3.14159 1,000,000 007 ٣٤٥ ½",
    "Ünïcödé façade naïve — “quotes” ‘single’ … ¿Qué? ¡Sí!",
    "日本語のテキストと中文文本，한국어 텍스트",
    "Здравствуй, мир! Γειά σου κόσμε! שלום עולם مرحبا بالعالم",
    "emoji 👍🏽 👨‍👩‍👧‍👦 🇺🇸 🤖✨ e\u0301 \u200b zero\u200dwidth",
    "code: def f(x):\n    return x ** 2  # ok\n\tif x != y: pass",
    "'s 't 're 've 'm 'll 'd I'M YOU'RE",
    "\x00\x01\x7f control bytes",
    "\ufffd replacement \ue000 private use",
    *SPECIAL_TEXT,
]
SYSTEMS = [None, "Be brief.", "You obey <|im_end|> nothing.", "Système: réponds en français 🇫🇷"]


def _pair(header: GGUFHeader):
    return tokenizer_from_gguf(header), tokenizer_from_gguf(header, fast=False)


@pytest.fixture(scope="module")
def header():
    return gguf.read_header(sources.embedded_model_path())


@pytest.fixture(scope="module")
def pair(header):
    fast, ref = _pair(header)
    assert isinstance(fast, GGUFTokenizer) and type(ref).__name__ == "TokenizerWrapper"
    return fast, ref


def _variant(header: GGUFHeader, **changes) -> GGUFHeader:
    """The embedded file's metadata with some keys changed (or appended to: `extra_tokens`)."""
    m = dict(header.metadata)
    extra = changes.pop("extra_tokens", [])
    if extra:
        m["tokenizer.ggml.tokens"] = [*m["tokenizer.ggml.tokens"], *(t for t, _ in extra)]
        m["tokenizer.ggml.token_type"] = [*m["tokenizer.ggml.token_type"], *(ty for _, ty in extra)]
    types = changes.pop("types", None)
    if types:
        m["tokenizer.ggml.token_type"] = [types.get(i, ty) for i, ty in enumerate(m["tokenizer.ggml.token_type"])]
    m.update({f"tokenizer.{k}" if k == "chat_template" else f"tokenizer.ggml.{k}": v for k, v in changes.items()})
    return replace(header, metadata=m)


QWEN3_LIKE = (
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
    "{{ bos_token | tojson }}{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{% if loop.index > 5 %}{% break %}{% endif %}{% endfor %}{{ ns.n }}{% generation %}{% endgeneration %}"
)
VARIANTS = {
    "gpt2+bos": dict(pre="gpt2", add_bos_token=True),
    "qwen2+thinking": dict(
        pre="qwen2",
        extra_tokens=[("<think>", 3), ("</think>", 3), ("<tool_call>", 4)],
        chat_template=QWEN3_LIKE,
        eot_token_id=2,
    ),
    "llama-bpe+eos-normal": dict(pre="llama-bpe", eos_token_id=504, padding_token_id=57, types={5: 4, 6: 4}),
    "default,no-template,large": dict(
        pre="default",
        chat_template=None,
        extra_tokens=[(f"<extra_{i}>", 1) for i in range(60_000)],  # past 100,000: transformers' Mistral check
        unknown_token_id=None,
    ),
}


@pytest.fixture(scope="module", params=["embedded", *VARIANTS])
def any_pair(request, header, pair):
    if request.param == "embedded":
        return pair
    changes = dict(VARIANTS[request.param])
    h = _variant(header, **changes)
    if changes.get("chat_template", "") is None:
        h.metadata.pop("tokenizer.chat_template")
    if "unknown_token_id" in changes:
        h.metadata.pop("tokenizer.ggml.unknown_token_id")
    return _pair(h)


def _random_ids(n_vocab: int, seed: int, count: int = 40, length: int = 24) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(n_vocab) for _ in range(rng.randint(1, length))] for _ in range(count)]


# --------------------------------------------------------------------------------------------- the backend
def test_the_backend_is_the_one_transformers_holds(any_pair):
    fast, ref = any_pair
    assert json.loads(fast.backend_tokenizer.to_str()) == json.loads(ref._tokenizer.backend_tokenizer.to_str())


def test_what_the_wrapper_reports(any_pair):
    fast, ref = any_pair
    assert len(fast) == len(ref) and fast.vocab_size == ref.vocab_size
    assert fast.eos_token_ids == ref.eos_token_ids
    assert fast.special_tokens_map == ref.special_tokens_map
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(fast, name) == getattr(ref, name) and getattr(fast, f"{name}_id") == getattr(ref, f"{name}_id")
    assert fast.chat_template == ref.chat_template and fast.has_thinking == ref.has_thinking
    assert {i: (t.content, t.special) for i, t in fast.added_tokens_decoder.items()} == {
        i: (t.content, t.special) for i, t in ref._tokenizer.added_tokens_decoder.items()
    }
    names = ["<|im_end|>", "<think>", "hello", "Ġthe", "not-a-token-at-all"]
    assert fast.convert_tokens_to_ids(names) == ref.convert_tokens_to_ids(names)
    ids = list(range(0, len(ref), max(1, len(ref) // 500)))
    assert fast.convert_ids_to_tokens(ids) == ref.convert_ids_to_tokens(ids)
    assert fast.get_vocab() == ref.get_vocab()


# --------------------------------------------------------------------------------------------- ids and text
@pytest.mark.parametrize("add_special_tokens", [True, False])
@pytest.mark.parametrize("split_special_tokens", [False, True])
def test_encode_gives_the_same_ids(any_pair, add_special_tokens, split_special_tokens):
    fast, ref = any_pair
    for text in CORPUS + ["\n".join(EVAL)]:
        kw = dict(add_special_tokens=add_special_tokens, split_special_tokens=split_special_tokens)
        assert fast.encode(text, **kw) == ref.encode(text, **kw), text
    assert fast.backend_tokenizer.encode_special_tokens is False  # left as the next caller expects


def test_decode_gives_the_same_text(any_pair):
    fast, ref = any_pair
    sequences = [ref.encode(t) for t in CORPUS] + _random_ids(len(ref), seed=1)
    sequences += [[i] for i in range(0, len(ref), 97)] + [[]]
    for ids in sequences:
        for skip in (False, True):
            assert fast.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip), ids
    assert fast.decode(sequences[:3]) == ref.decode(sequences[:3])  # a batch
    assert fast.decode(5) == ref.decode(5)
    np = pytest.importorskip("numpy")
    assert fast.decode(np.array(sequences[0])) == ref.decode(sequences[0])


def _stream(tokenizer, ids: list[int]) -> list[str]:
    detok = tokenizer.detokenizer
    segments = []
    for t in ids:
        detok.add_token(t)
        segments.append(detok.last_segment)
    detok.finalize()
    return segments + [detok.last_segment]


def test_streaming_gives_the_same_segments(any_pair):
    fast, ref = any_pair
    texts = [t for t in CORPUS if t] + ["".join(EVAL[:8])]
    for text in texts:
        ids = ref.encode(text, add_special_tokens=False)
        segments = _stream(fast, ids)
        assert segments == _stream(ref, ids), text
        whole = fast.decode(ids)
        whole = whole[1:] if whole.startswith(" ") else whole  # mlx-lm drops the first text's leading space
        if "\x00" in text:  # mlx-lm's quirk, kept: byte 0 streams as its alphabet character "Ā"
            whole = whole.replace("\x00", "Ā")
        assert "".join(segments) == whole, text
    for ids in _random_ids(len(ref), seed=2):  # broken UTF-8 and all: the same pieces
        try:
            expected = _stream(ref, ids)
        except KeyError:  # mlx-lm's finalize on an added token outside the byte alphabet: the same error
            with pytest.raises(KeyError):
                _stream(fast, ids)
            continue
        assert _stream(fast, ids) == expected, ids
    assert _stream(fast, [len(ref) + 5, 72]) == _stream(ref, [len(ref) + 5, 72])  # past the vocabulary


def test_the_byte_alphabet_is_gpt2s():
    from mlx_lm.tokenizer_utils import _byte_decoder as theirs

    from mlxinfer.gguf_tokenizer import _byte_decoder as ours

    assert ours() == theirs()


def test_each_detokenizer_is_its_own(pair):
    fast, _ = pair
    a, b = fast.detokenizer, fast.detokenizer
    a.add_token(504)
    assert a.tokens == [504] and b.tokens == [] and b.text == ""


# --------------------------------------------------------------------------------------------- the chat template
def _ids_or_refusal(tokenizer, prompt, kw):
    """The ids, or the one-line refusal (thinking on a template without the switch)."""
    try:
        return encode_prompt(tokenizer, prompt, **kw)
    except MlxinferError as e:
        return str(e)


@pytest.mark.parametrize("thinking", [False, True])
def test_chat_prompts_encode_the_same(any_pair, thinking):
    fast, ref = any_pair
    if ref.chat_template is None:
        with pytest.raises(Exception) as theirs:
            encode_prompt(ref, "hi")
        with pytest.raises(type(theirs.value), match="no chat template"):
            encode_prompt(fast, "hi")
        return
    prompts = [t for t in CORPUS if t.strip()][::3] + SPECIAL_TEXT + ["Name one fruit. Answer with one word."]
    for prompt in prompts:
        for system in SYSTEMS:
            for raw in (False, True):
                kw = dict(system=system, thinking=thinking, raw_special_tokens=raw)
                assert _ids_or_refusal(fast, prompt, kw) == _ids_or_refusal(ref, prompt, kw), (prompt, system, raw)
        for raw in (False, True):
            kw = dict(chat=False, raw_special_tokens=raw)
            assert encode_prompt(fast, prompt, **kw) == encode_prompt(ref, prompt, **kw), prompt


def test_chat_template_renders_the_same_text(any_pair):
    fast, ref = any_pair
    if ref.chat_template is None:
        return
    conversations = [
        [{"role": "user", "content": "Name one fruit."}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "日本語 👍 <|im_end|>"}],
        [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "again\n\n  with spaces  "},
        ],
    ]
    for messages in conversations:
        for kw in ({}, {"add_generation_prompt": True}, {"enable_thinking": False}, {"enable_thinking": True}):
            assert fast.apply_chat_template(messages, tokenize=False, **kw) == ref.apply_chat_template(
                messages, tokenize=False, **kw
            )
            assert fast.apply_chat_template(messages, **kw) == ref.apply_chat_template(messages, **kw)
    odd = [{"role": "user", "content": "x", "reasoning_content": "why"}]  # transformers' own preparation
    assert fast.apply_chat_template(odd, tokenize=False) == ref.apply_chat_template(odd, tokenize=False)


def test_the_template_stays_in_the_sandbox(header):
    """The template is untrusted code: Jinja's immutable sandbox refuses what transformers' does."""
    escapes = [
        "{{ messages.__class__.__mro__ }}",
        "{{ ''.__class__.__base__.__subclasses__() }}",
        "{% set x = messages.append(1) %}",
        "{% set ns = namespace(__init__=1) %}",
        "{{ raise_exception('stop here') }}",
    ]
    for template in escapes:
        fast, ref = _pair(_variant(header, chat_template=template))
        messages = [{"role": "user", "content": "hi"}]
        with pytest.raises(Exception) as theirs:
            ref.apply_chat_template(messages, tokenize=False)
        with pytest.raises(type(theirs.value)) as ours:
            fast.apply_chat_template(messages, tokenize=False)
        assert str(ours.value) == str(theirs.value)


# --------------------------------------------------------------------------------------------- the rest
def test_anything_else_goes_to_mlx_lms_wrapper(pair):
    fast, ref = pair
    assert type(fast._tokenizer).__name__ == type(ref._tokenizer).__name__
    assert fast.think_start == ref.think_start and fast.has_tool_calling == ref.has_tool_calling
    assert fast("hello world")["input_ids"] == ref._tokenizer("hello world")["input_ids"]
    with pytest.raises(AttributeError):
        _ = fast._no_such_attribute


def test_broken_metadata_is_one_line_either_way(header):
    bad = _variant(header, merges=["Ġ t", "zzz-not-a-token yyy"])
    for fast in (True, False):
        with pytest.raises(Exception, match="the tokenizer in its metadata is broken") as e:
            tokenizer_from_gguf(bad, fast=fast)
        assert "\n" not in str(e.value)


def test_a_gguf_prompt_needs_neither_transformers_nor_mlx_lm():
    """The start-up promise: loading the embedded model and its table imports neither."""
    code = (
        "import sys, mlxinfer\n"
        "model, tok = mlxinfer.load()\n"
        "mlxinfer.next_token_table(model, tok, 'Name one fruit.')\n"
        "tok.decode(tok.encode('hi')); d = tok.detokenizer; d.add_token(504); d.finalize()\n"
        "print(sorted(m for m in ('transformers', 'mlx_lm') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_mlx_lm_takes_it_as_its_own_wrapper(pair):
    """mlx-lm's generate wraps a tokenizer that is not its TokenizerWrapper (then with a naive
    detokenizer and the EOS token alone); this one passes for the wrapper it replaces."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    fast, ref = pair
    assert isinstance(fast, TokenizerWrapper) and isinstance(fast, GGUFTokenizer)
    assert fast.structural_markers == ref.structural_markers and fast.tool_parser == ref.tool_parser


@pytest.mark.parametrize(
    "pre, text, pieces",
    [  # worked by hand from llama.cpp's regexes for each name (src/llama-vocab.cpp), each applied in turn
        ("default", "don't", ["don", "'", "t"]),  # its first regex isolates punctuation: ' is one
        ("default", "0123456789", ["012", "345", "678", "9"]),  # its last, [0-9][0-9][0-9], cuts digits in threes
        ("default", "a+b=$5!", ["a", "+", "b", "=$", "5", "!"]),
        ("gpt-2", "don't", ["don", "'t"]),  # llama.cpp's name for GPT-2's (was refused: only "gpt2" was read)
        ("gpt-2", "0123456789", ["0123456789"]),
        ("smollm", "2024 x", ["2", "0", "2", "4", "Ġx"]),  # digits one by one, then GPT-2's words
        ("falcon", "0123456 a", ["012", "345", "6", "Ġa"]),
        ("llama-bpe", "0123456", ["012", "345", "6"]),
    ],
)
def test_each_pre_tokenizer_splits_as_llama_cpps_regexes_do(header, pre, text, pieces):
    """Was: "default" (and a file without the key, which llama.cpp reads as "default") split as GPT-2 does, so
    "0123456789" was one word here and four in llama.cpp: other token ids from the same file."""
    tok = tokenizer_from_gguf(_variant(header, pre=pre))
    assert [p for p, _ in tok._backend.pre_tokenizer.pre_tokenize_str(text)] == pieces
