"""Stop strings, one rule for every driver of the row core: the text ends before the first stop string
(finish_reason "stop"), streamed text is held back only while it could still begin one, and a seed's
tokens up to the stop are its tokens without it. The oracle is the same seed's run without a stop string,
cut by hand (str.index)."""

from __future__ import annotations

import json

import pytest

import mlxinfer
from conftest import assert_one_line_error, invoke_cli

HERB = "Name one herb to add to tomato soup. Answer with one word."


def _cut(text: str, stops: list[str]) -> str:
    hits = [text.index(s) for s in stops if s in text]
    return text[: min(hits)] if hits else text


@pytest.fixture(scope="module")
def free(embedded_quantized):
    """Seeds 0..5 without a stop string, 12 tokens: what every stopped run is cut from."""
    model, tok = embedded_quantized
    return mlxinfer.sample(model, tok, HERB, seeds=6, settings={"temperature": 1.0}, max_tokens=12)


def _stops_for(text: str) -> list[str]:
    """A stop string inside `text` (its third word, or a letter of it) that is not at its start."""
    words = text.split()
    return [words[2]] if len(words) > 2 else [text[len(text) // 2 :] or "x"]


def test_sample_cuts_each_seed_at_its_first_stop_string(embedded_quantized, free):
    model, tok = embedded_quantized
    stops = [" the", "."]
    report = mlxinfer.sample(model, tok, HERB, seeds=6, settings={"temperature": 1.0}, max_tokens=12, stop=stops)
    cut = 0
    for mine, whole in zip(report.completions, free.completions):
        assert mine.text == _cut(whole.text, stops)
        if mine.text != whole.text:
            cut += 1
            assert mine.finish_reason == "stop"
            assert whole.tokens[: len(mine.tokens)] == mine.tokens  # the same draws up to the stop
        else:
            assert (mine.finish_reason, mine.tokens) == (whole.finish_reason, whole.tokens)
    assert cut >= 2, [c.text for c in free.completions]  # the stop strings were really met


def test_stream_holds_back_only_what_could_begin_a_stop_string(embedded_quantized, free):
    model, tok = embedded_quantized
    whole = free.completions[0]
    stop = _stops_for(whole.text)[0]
    stream = mlxinfer.stream_generate(
        model, tok, HERB, settings={"temperature": 1.0}, seed=0, max_tokens=12, stop=[stop]
    )
    shown, final = "", _cut(whole.text, [stop])
    for step in stream:
        shown += step.text
        assert final.startswith(shown)  # nothing past the stop is ever shown
    assert shown == stream.result.text == _cut(whole.text, [stop])
    assert stream.result.finish_reason == "stop"


def test_stop_strings_hold_back_only_a_possible_beginning():
    from mlxinfer.engine.core import StopStrings

    stops = StopStrings(["soup.", "\n\n"])
    pieces = [stops.feed(t) for t in ("Basil", " so", "up", " or\n", "thyme", "\n", "\nmore")]
    assert pieces == [
        ("Basil", False),  # no tail of "Basil" begins a stop string
        (" ", False),  # "so" may begin "soup.": held
        ("", False),  # "soup" still may
        ("soup or", False),  # "soup " cannot; "\n" may begin "\n\n"
        ("\nthyme", False),
        ("", False),
        ("", True),  # "\n\n" met: the text ends before it
    ]
    assert stops.flush() == ""


def test_sweep_records_cut_at_the_stop_string(embedded_quantized, free, tmp_path):
    model, tok = embedded_quantized
    report = mlxinfer.sweep(
        model, tok, [HERB], settings=[{"temperature": 1.0}], seeds=6, max_tokens=12, stop=[" the", "."],
        out=tmp_path / "r.jsonl",
    )  # fmt: skip
    assert [r.text for r in report.records] == [_cut(c.text, [" the", "."]) for c in free.completions]
    header = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
    assert header["stop"] == [" the", "."]  # a resume with other stop strings is another experiment
    with pytest.raises(mlxinfer.MlxinferError, match="stop"):
        mlxinfer.sweep(
            model, tok, [HERB], settings=[{"temperature": 1.0}], seeds=6, max_tokens=12, stop=["."],
            out=tmp_path / "r.jsonl", resume=True,
        )  # fmt: skip


def test_cli_stop_and_its_bad_values(free, tmp_path):
    whole = free.completions[1]
    stop = _stops_for(whole.text)[0]
    args = ["generate", "-p", HERB, "--temp", "1", "--seed", "1", "--max-tokens", "12", "--compute-dtype", "bfloat16"]
    done = invoke_cli(*args, "--stop", stop, "--json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got["text"], got["finish_reason"]) == (_cut(whole.text, [stop]), "stop")
    for bad in ("", "x" * 300):
        assert_one_line_error(invoke_cli(*args, "--stop", bad), "--stop must be")
    # bytes a shell passes that are not UTF-8 arrive as a surrogate: was a traceback from sweep's writer
    out = tmp_path / "r.jsonl"
    sweep = ["sweep", "-p", HERB, "--seeds", "2", "--max-tokens", "2", "--stop", "\udcff", "--out", str(out)]
    assert_one_line_error(invoke_cli(*sweep), "--stop", "not valid UTF-8")
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("stop", [[""], "x" * 257, [1], ["a"] * 17, {"a": 1}, b"a"])
def test_library_refuses_bad_stop_values(embedded_quantized, stop):
    model, tok = embedded_quantized
    with pytest.raises(mlxinfer.MlxinferError, match="stop must be") as e:
        mlxinfer.generate(model, tok, HERB, max_tokens=2, stop=stop)
    assert e.value.params == ("stop",)


def test_a_plain_text_completion_continues_the_prompt(embedded_quantized):
    """chat=False (and token ids): the text continues the prompt's, its first token's leading space kept, so
    prompt + text reads whole and a stop string that begins with that space is met; the oracle is the
    tokenizer's decode of prompt and completion together. A chat reply begins its own message: no space."""
    model, tok = embedded_quantized
    prompt = "The capital of France is"
    run = mlxinfer.generate(model, tok, prompt, chat=False, settings={"temperature": 0.0}, max_tokens=4)
    ids = tok.encode(prompt)
    assert prompt + run.text == tok.decode(ids + run.tokens) and run.text.startswith(" ")
    by_ids = mlxinfer.generate(model, tok, ids, settings={"temperature": 0.0}, max_tokens=4)
    assert by_ids.text == run.text
    word = run.text.split()[0]
    cut = mlxinfer.generate(
        model, tok, prompt, chat=False, settings={"temperature": 0.0}, max_tokens=4, stop=" " + word
    )
    assert (cut.text, cut.finish_reason) == ("", "stop")
    drawn = mlxinfer.sample(model, tok, prompt, chat=False, seeds=[0], settings={"temperature": 0.0}, max_tokens=4)
    assert drawn.completions[0].text == run.text
    reply = mlxinfer.generate(model, tok, prompt, settings={"temperature": 0.0}, max_tokens=4)
    assert not reply.text.startswith(" ")


def test_a_prompt_far_past_the_context_is_refused_before_it_is_encoded_whole(embedded_quantized):
    """A megabyte of digits (one token each) took seconds to encode before its length was refused; its
    first 4 x context characters already pass the context, and that is said at once."""
    model, tok = embedded_quantized
    context = model.config.max_position_embeddings
    with pytest.raises(mlxinfer.MlxinferError, match=f"more than {context:,} tokens in its first {4 * context:,} char"):
        mlxinfer.generate(model, tok, "1234567890" * 100_000, chat=False, max_tokens=1)
    with pytest.raises(mlxinfer.MlxinferError, match="more than"):  # inside a chat message too
        mlxinfer.generate(model, tok, "1234567890" * 100_000, max_tokens=1)
    with pytest.raises(mlxinfer.MlxinferError, match="the prompt is [0-9,]+ tokens but the model's context is"):
        mlxinfer.generate(model, tok, "1" * (context + 10), chat=False, max_tokens=1)  # under 4 x: counted whole
    # counted as the prompt is encoded: with raw_special_tokens a control token's name is one token (counted as
    # plain text, 3,300 of them had been refused as more than the context)
    raw = mlxinfer.prepare(model, tok, "<|im_end|>" * 3300, chat=False, raw_special_tokens=True, max_tokens=1)
    assert len(raw.ids) == 3300


def _sentencepiece_checkpoint(out, metaspace: bool):
    """A tiny llama with a SentencePiece-style tokenizer: mlx-lm detokenizes it with its SPM detokenizer,
    or (a Metaspace decoder) with its naive one, which decodes its tokens whole."""
    import checkpoints as C
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    C.write_checkpoint(out, "llama", vocab_size=640)
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
        tok.decoder = decoders.Sequence(steps)
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + C.SPECIALS[1:]
    tok.train_from_iterator(C.CORPUS, trainers.BpeTrainer(vocab_size=380, special_tokens=specials, limit_alphabet=40))
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "chat_template": C.CHAT_TEMPLATE, "model_max_length": 512}  # fmt: skip
    (out / "tokenizer_config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("metaspace", [False, True], ids=["spm", "metaspace"])
def test_a_sentencepiece_completion_continues_the_prompt_too(tmp_path, metaspace):
    """The continuation rule with mlx-lm's other detokenizers: the naive one decodes its tokens whole, and
    finalized after the prompt's tokens it decoded the first new one afresh, its space dropped again."""
    _sentencepiece_checkpoint(tmp_path, metaspace)
    model, tok = mlxinfer.load(tmp_path, compute_dtype="bfloat16")
    prompt = "The cat sat on the"
    pieces = {i: tok.convert_ids_to_tokens(i) for i in range(tok.vocab_size)}
    word = next(i for i, p in pieces.items() if p.startswith("\u2581") and p[1:].isalpha())  # a word after a space
    settings = {"temperature": 0.0, "logit_bias": {word: 100.0}}
    run = mlxinfer.generate(model, tok, prompt, chat=False, settings=settings, max_tokens=2)
    assert run.tokens[0] == word and run.text.startswith(" "), run.text
    first = " " + run.text.split()[0]
    cut = mlxinfer.generate(model, tok, prompt, chat=False, settings=settings, max_tokens=2, stop=first)
    assert (cut.text, cut.finish_reason) == ("", "stop")
