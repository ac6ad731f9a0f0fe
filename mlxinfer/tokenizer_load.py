"""Loading a tokenizer: a model directory's files through mlx-lm's tokenizer utilities (transformers
underneath, never with remote code), or the vocabulary, merges, special tokens and chat template a GGUF file
carries in its metadata, rebuilt as a Hugging Face `tokenizers` BPE (gguf_tokenizer.py serves it without
transformers or mlx-lm: the same ids, text and streamed segments, so a GGUF model starts in a fraction of the
time). tokenizer.py encodes prompts with what is loaded here.
"""

from __future__ import annotations

import os
from pathlib import Path

from .chat_template import route_transformers
from .errors import MlxinferError, first_line, is_whole
from .formats.gguf import GGUFHeader
from .formats.paths import check_side_files

# llama.cpp's pre-tokenizers (src/llama-vocab.cpp): each name's regexes, applied in turn, each splitting the
# pieces the one before left (what a regex does not match stays a piece of its own), then byte-level BPE
_GPT2_WORDS = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_QWEN2_WORDS = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_WORDS = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3 = ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2")  # ignore_merges
_FAMILIES = {
    # a file without the key is read as "default", as llama.cpp reads it (with its warning)
    ("default",): (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_WORDS, r"\p{N}+", r"[0-9][0-9][0-9]"),
    ("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "exaone4"): (_GPT2_WORDS,),  # gpt2: older files' spelling
    ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"): (r"\p{N}", _GPT2_WORDS),
    ("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"): (_QWEN2_WORDS,),
    (*_LLAMA3, "dbrx", "smaug-bpe"): (_LLAMA3_WORDS,),
    ("falcon",): (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2_WORDS, r"[0-9][0-9][0-9]"),
}
_PRE = {name: regexes for names, regexes in _FAMILIES.items() for name in names}
CONTROL, USER_DEFINED = 3, 4


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
            f"the tokenizer in {directory} could not be loaded ({first_line(e)}); re-download its tokenizer files"
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
            f"{header.path}: GGUF pre-tokenizer {str(pre)[:40]!r} is not supported (supported: "
            f"{', '.join(sorted(_PRE))}); load the model's safetensors checkpoint instead"
        )
    tokens = m.get("tokenizer.ggml.tokens")
    types = m.get("tokenizer.ggml.token_type", [1] * len(tokens) if isinstance(tokens, list) else None)
    merges = m.get("tokenizer.ggml.merges")  # a byte-level BPE without them splits text into characters
    template = m.get("tokenizer.chat_template")
    broken = (
        "vocabulary (tokenizer.ggml.tokens)"
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
            raise MlxinferError(f"{header.path}: the tokenizer in its metadata is broken ({first_line(e)})") from None

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

    bpe = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, ignore_merges=pre in _LLAMA3)
    tok = Tokenizer(bpe)
    steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _PRE[pre]]
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
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
    return is_whole(i) and 0 <= i < n
