"""-p - (the prompt from standard input) and --prompt-file PATH, on every command that takes a prompt."""

from __future__ import annotations

import json

import pytest
from conftest import assert_one_line_error, invoke_cli

FRUIT = "Name one fruit. Answer with one word."
COMMANDS = {  # each command that takes a prompt, with what else it needs to run
    "topk": [],
    "generate": ["--max-tokens", "2"],
    "sample": ["--seeds", "2", "--max-tokens", "2"],
    "answers": ["--max-nodes", "4"],
    "tokens": [],
    "sweep": ["--seeds", "2", "--max-tokens", "2"],
}


@pytest.fixture
def files(tmp_path):
    made = {
        "prompt": FRUIT + "\n",
        "latin1": "caf\xe9".encode("latin-1"),
        "empty": "",
        "blank": " \n\n",
    }
    for name, data in made.items():
        path = tmp_path / name
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return tmp_path


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    "how, fragments",
    [
        (["-p", "hi", "--prompt-file", "{dir}/prompt"], ["not both"]),
        (["--prompt-file", "{dir}/missing"], ["--prompt-file", "does not exist"]),
        (["--prompt-file", "{dir}"], ["--prompt-file", "is a directory"]),
        (["--prompt-file", "{dir}/latin1"], ["--prompt-file", "not UTF-8"]),
        (["--prompt-file", "{dir}/empty"], ["--prompt-file", "is empty"]),
        (["--prompt-file", "{dir}/blank"], ["is empty"]),
        (["--prompt-file", ""], ["--prompt-file is empty", "path"]),  # was: "--prompt-file . is a directory"
        (["-p", ""], ["--prompt is empty"]),  # was: a table for the chat template alone (an empty file was refused)
        (["-p", " \n"], ["--prompt is empty"]),
    ],
)
def test_bad_prompt_input_is_one_line(files, command, how, fragments):
    args = [a.format(dir=files) for a in how]
    assert_one_line_error(invoke_cli(command, *args, *COMMANDS[command]), *fragments)


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("data, fragment", [(b"", "is empty"), (b"\xff\xfe", "not UTF-8"), (b"\n", "is empty")])
def test_bad_standard_input_is_one_line(command, data, fragment):
    assert_one_line_error(invoke_cli(command, "-p", "-", *COMMANDS[command], input=data), "standard input", fragment)


def test_no_prompt_at_all_says_how_to_give_one():
    assert_one_line_error(invoke_cli("topk"), "-p TEXT", "--prompt-file")


@pytest.mark.parametrize("command", ["topk", "generate", "sweep"])
def test_text_piped_in_is_the_prompt_when_none_is_named(command):
    """`echo TEXT | mlxinfer generate`, as `-p -`: read where standard input is a pipe or a file and no prompt
    is named; with a terminal or /dev/null there, the one line that says how to give one."""
    import subprocess
    import sys

    from conftest import ROOT

    run = [sys.executable, "-m", "mlxinfer", command, *COMMANDS[command], "--json"]
    piped = subprocess.run(run, input=FRUIT + "\n", capture_output=True, text=True, cwd=ROOT, timeout=300)
    named = invoke_cli(command, "-p", FRUIT, *COMMANDS[command], "--json")
    assert piped.returncode == 0 and named.returncode == 0, piped.stderr + named.stderr
    if command == "sweep":
        assert [c["prompt"] for c in json.loads(piped.stdout)["cells"]] == [FRUIT]
    else:
        assert _ids(piped) == _ids(named)
    nothing = subprocess.run(run, stdin=subprocess.DEVNULL, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert_one_line_error(nothing, "give a prompt" if command != "sweep" else "give prompts")


def _ids(result) -> list[int]:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["prompt_ids"]


def test_stdin_and_a_file_are_the_prompt_text(files, monkeypatch):
    """The same prompt ids whichever way the text comes: -p TEXT, -p - (a final line break dropped, as
    `echo` adds it) and --prompt-file; a line break inside the text is kept."""
    given = _ids(invoke_cli("topk", "-p", FRUIT, "--json"))
    assert _ids(invoke_cli("topk", "-p", "-", "--json", input=FRUIT + "\n")) == given
    assert _ids(invoke_cli("topk", "--prompt-file", str(files / "prompt"), "--json")) == given
    two_lines = "Name one fruit.\nAnswer with one word."
    (files / "two").write_text(two_lines + "\r\n")
    generated = invoke_cli("generate", "--prompt-file", str(files / "two"), "--max-tokens", "2", "--json")
    assert _ids(generated) == _ids(invoke_cli("generate", "-p", two_lines, "--max-tokens", "2", "--json"))
    assert _ids(generated) != given
    # was: the byte order mark a Windows editor writes first became the prompt's first character
    (files / "bom").write_bytes(b"\xef\xbb\xbf" + (FRUIT + "\r\n").encode())
    assert _ids(invoke_cli("topk", "--prompt-file", str(files / "bom"), "--json")) == given
    assert _ids(invoke_cli("topk", "-p", "-", "--json", input=b"\xef\xbb\xbf" + FRUIT.encode())) == given
    # a pipe, as llama.cpp's -f reads one (`--prompt-file <(...)`, /dev/stdin): was "is a pipe, not a file"
    import os
    import threading

    fifo = files / "fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(FRUIT + "\n"), daemon=True)
    writer.start()
    assert _ids(invoke_cli("topk", "--prompt-file", str(fifo), "--json")) == given
    writer.join(timeout=60)
    # but not under mlx.launch, whose ranks would each open it and one would read it
    from mlxinfer.errors import MlxinferError
    from mlxinfer.formats.paths import read_prompt

    monkeypatch.setenv("MLX_RANK", "0")
    with pytest.raises(MlxinferError, match="ranks of mlx.launch cannot each read"):
        read_prompt(str(fifo))


def test_sweep_reads_a_prompt_from_stdin(files):
    result = invoke_cli("sweep", "-p", "-", "--seeds", "2", "--max-tokens", "2", "--json", input=FRUIT + "\n")
    assert result.returncode == 0, result.stderr
    assert {cell["prompt"] for cell in json.loads(result.stdout)["cells"]} == {FRUIT}


def test_sweep_reads_standard_input_once():
    """Was: `-p - -p -` said "standard input (-p -) is empty" (the second read found it used up)."""
    result = invoke_cli("sweep", "-p", "-", "-p", "-", "--seeds", "2", "--max-tokens", "2", input=FRUIT + "\n")
    assert_one_line_error(result, "-p - is given 2 times", "standard input can be read once", "give -p - once")
    two = invoke_cli("sweep", "-p", "-", "-p", "hi", "--seeds", "2", "--max-tokens", "2", "--json", input=FRUIT)
    assert two.returncode == 0, two.stderr
    assert [cell["prompt"] for cell in json.loads(two.stdout)["cells"]] == [FRUIT, "hi"]


def test_a_prompts_file_line_past_the_context_is_named_by_its_line(checkpoint_dir, tmp_path):
    """Was: "the --prompt is N tokens ... (#2 of the 2 prompts: ...)": the nth prompt, not the file's line
    (blank lines are skipped), and a flag that gave none of them."""
    import mlxinfer

    path = tmp_path / "prompts.txt"
    path.write_text("\nhi\n\n" + "word " * 2000 + "\nbye\n")
    model = str(checkpoint_dir("llama"))
    result = invoke_cli("sweep", "-m", model, "--prompts", str(path), "--seeds", "2", "--max-tokens", "2")
    assert_one_line_error(result, f"--prompts {path} line 4: the prompt is", "context is 512", "shorten the prompt")
    assert "--prompt " not in result.stderr and "#2 of" not in result.stderr
    m, tok = mlxinfer.load(model)
    with pytest.raises(mlxinfer.MlxinferError, match=r"prompts_file .*prompts\.txt line 4: the prompt is"):
        mlxinfer.sweep(m, tok, mlxinfer.prompts_from_file(path), settings=[{}], seeds=2, max_tokens=2)
    with pytest.raises(mlxinfer.MlxinferError, match=r"\(#2 of the 3 prompts"):  # a plain list: its index
        mlxinfer.sweep(m, tok, list(mlxinfer.prompts_from_file(path)), settings=[{}], seeds=2, max_tokens=2)


def test_a_prompts_file_numbers_its_lines_as_an_editor_does(tmp_path):
    """The prompts are what str.splitlines gave before the line numbers (a \\v or \\f inside a line splits
    it, \\r\\n is one break); the numbers count the file's \\n-ended lines."""
    import mlxinfer

    text = "a\r\n\r\nb\x0bc\n  \nd\n"
    path = tmp_path / "prompts.txt"
    path.write_bytes(text.encode())
    prompts = mlxinfer.prompts_from_file(path)
    assert prompts == [line.strip() for line in text.splitlines() if line.strip()] == ["a", "b", "c", "d"]
    assert prompts.lines == [1, 3, 3, 5]


def test_a_prompt_past_the_context_is_named_by_where_it_came_from(checkpoint_dir, tmp_path):
    """Was: "the --prompt is N tokens" for a prompt read from --prompt-file or standard input."""
    model = str(checkpoint_dir("llama"))
    long = tmp_path / "long.txt"
    long.write_text("word " * 2000)
    by_file = invoke_cli("topk", "-m", model, "--prompt-file", str(long))
    assert_one_line_error(by_file, f"the --prompt-file {long} is", "context is 512")
    by_stdin = invoke_cli("topk", "-m", model, "-p", "-", input=long.read_bytes())
    assert_one_line_error(by_stdin, "the standard input (-p -) is", "context is 512")
    swept = invoke_cli("sweep", "-m", model, "--prompt-file", str(long), "--seeds", "2", "--max-tokens", "2")
    assert_one_line_error(swept, f"the --prompt-file {long} is", "context is 512")
    assert "--prompt " not in by_file.stderr + by_stdin.stderr + swept.stderr


def test_a_prompt_the_chat_template_rendered_already_is_refused(embedded):
    """mlx-lm's pattern, apply_chat_template(..., tokenize=False) and then the string, was wrapped in the
    template a second time (98 tokens, the model answering the template's text). It is one error naming
    both fixes; read as written it is the messages' own ids; a control token's name inside a text is
    still text (only its opening says "templated")."""
    import mlxinfer
    from mlxinfer.errors import MlxinferError
    from mlxinfer.tokenizer import encode_prompt

    model, tok = embedded
    messages = [{"role": "user", "content": "Name one fruit."}]
    ids = encode_prompt(tok, messages)
    rendered = tok.decode(ids)
    assert rendered.startswith("<|im_start|>")
    with pytest.raises(MlxinferError, match="rendered by a chat template already"):
        mlxinfer.generate(model, tok, rendered, max_tokens=2)
    assert encode_prompt(tok, rendered, chat=False, raw_special_tokens=True) == ids
    assert len(encode_prompt(tok, "Name one fruit.<|im_end|>")) > len(ids)  # text, in the template
    # a question about one control token opens with it alone: text, as before
    assert encode_prompt(tok, "<|im_start|> opens a turn; what closes one?")
    result = invoke_cli("generate", "-p", rendered, "-n", "2")
    assert_one_line_error(result, "--no-chat with --raw-special-tokens")


def test_prompts_dash_reads_standard_input_as_the_other_prompt_options_do(checkpoint_dir, tmp_path, monkeypatch):
    """Was: `printf 'a\\nb\\n' | mlxinfer sweep --prompts -` said "--prompts - does not exist", where -p - and
    --prompt-file - read standard input. The same records as the same prompts from a file; under mlx.launch
    (whose ranks' standard input never ends) one line instead of a wait for ever."""
    model = str(checkpoint_dir("llama"))
    path = tmp_path / "prompts.txt"
    path.write_text("hi\n\nthe cat\n")
    common = ["sweep", "-m", model, "--seeds", "2", "--max-tokens", "2", "--json"]
    piped = invoke_cli(*common, "--prompts", "-", input=path.read_bytes())
    filed = invoke_cli(*common, "--prompts", str(path))
    assert piped.returncode == 0, piped.stderr
    cells = [json.loads(r.stdout)["cells"] for r in (piped, filed)]
    assert cells[0] == cells[1] and {c["prompt"] for c in cells[0]} == {"hi", "the cat"}
    assert_one_line_error(invoke_cli(*common, "--prompts", "-", input=b"\n \n"), "--prompts - holds no prompt")
    monkeypatch.setenv("MLX_RANK", "0")
    launched = invoke_cli(*common, "--prompts", "-", input=b"hi\n")
    assert_one_line_error(launched, "mlx.launch keeps open", "--prompts FILE")
