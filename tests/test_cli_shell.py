"""The command line around the commands: shell completion, --debug anywhere, a mistyped command's hint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, assert_one_line_error, invoke_cli
from terminal import Terminal

import mlxinfer

MLXINFER = str(Path(sys.executable).with_name("mlxinfer"))  # the installed script: completion keys on its name


def shell(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MLXINFER, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


@pytest.mark.parametrize(
    "name, marker",
    [
        ("bash", "complete -o default -F _mlxinfer_completion mlxinfer"),
        ("zsh", "#compdef mlxinfer"),
        ("fish", "complete --command mlxinfer"),
    ],
)
def test_show_completion_prints_the_named_shells_script(name, marker):
    """The shell named, whatever shell runs the command (Typer's own flag would print the running one's)."""
    r = shell("--show-completion", name, env={"SHELL": "/bin/sh"})
    assert r.returncode == 0 and marker in r.stdout, (r.stdout, r.stderr)
    assert "_MLXINFER_COMPLETE=complete_" + name in r.stdout


def test_the_script_s_callback_completes_commands_and_options():
    """What bash's script runs on TAB: the commands and each command's options, no model loaded."""

    def complete(words: str, cword: int) -> list[str]:
        env = {"_MLXINFER_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(cword)}
        r = shell(env=env)
        assert r.returncode == 0, r.stderr
        return r.stdout.split()

    assert complete("mlxinfer ch", 1) == ["chat"]
    assert "--prompt-file" in complete("mlxinfer generate --pr", 2)
    assert complete("mlxinfer chat --max", 2) == ["--max-tokens"]


def test_install_completion_writes_bash_s_files(tmp_path):
    r = shell("--install-completion", "bash", env={"HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    script = tmp_path / ".bash_completions" / "mlxinfer.sh"
    assert "_mlxinfer_completion" in script.read_text()
    assert str(script) in (tmp_path / ".bashrc").read_text()


def test_an_unknown_shell_is_one_line():
    assert_one_line_error(invoke_cli("--show-completion", "tcsh"), "--show-completion", "bash, zsh, fish")


def test_a_mistyped_command_gets_its_hint_once():
    r = invoke_cli("tpk", "-p", "hi")
    assert_one_line_error(r, "No such command 'tpk'")
    assert r.stderr.count("Did you mean 'topk'?") == 1


@pytest.mark.parametrize("where", ["before the command", "after the command", "at the end"])
def test_debug_anywhere_on_the_line_prints_the_detail(where, tmp_path):
    """An error with detail lines (a NaN in the embedding: each layer's counts) shows them with --debug in
    any position; a prompt that reads "--debug" stays the prompt."""
    import checkpoints
    import mlx.core as mx

    path = checkpoints.write_checkpoint(tmp_path / "nan", "llama")
    weights = mx.load(str(path / "model.safetensors"))
    name = next(k for k in weights if "embed_tokens" in k)
    weights[name] = mx.full(weights[name].shape, float("nan"), dtype=weights[name].dtype)
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    args = ["-m", str(path), "-p", "hi"]
    line = {
        "before the command": ["--debug", "topk", *args],
        "after the command": ["topk", "--debug", *args],
        "at the end": ["topk", *args, "--debug"],
    }[where]
    plain = invoke_cli("topk", *args)
    assert_one_line_error(plain, "NaN or inf", "--debug ... shows more")
    detailed = invoke_cli(*line)
    lines = detailed.stderr.splitlines()
    assert detailed.returncode == 2 and lines[0].startswith("error: ") and "--debug" not in lines[0]
    assert len(lines) > 1 and all(line.startswith("  ") for line in lines[1:])
    # -p's value is the text "--debug": the prompt, not the flag, so the error stays one line
    assert_one_line_error(invoke_cli("topk", "-m", str(path), "-p", "--debug"), "NaN or inf", "shows more")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this platform")
@pytest.mark.parametrize("args", [["count"], ["count", "--json"], ["info"]])
def test_an_output_that_cannot_be_written_is_one_line(args):
    """Was: `mlxinfer count > /dev/full` a traceback ending in OSError: [Errno 28] No space left on device."""
    with open("/dev/full", "w") as full:
        r = subprocess.run([MLXINFER, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: cannot write the output (No space left on device)")


def closed(fd: int):
    return lambda: os.close(fd)  # run in the child before exec: the stream is closed, as `<&-` leaves it


@pytest.mark.parametrize("args", [["count"], ["count", "--json"], ["info", "--json"], ["--help"]])
def test_a_closed_stdout_is_one_line(args):
    """Was: `mlxinfer count --json >&-` a traceback ending in AttributeError ('NoneType' has no 'write'), and
    `mlxinfer count >&-` exit 0 with the output lost."""
    r = subprocess.run([MLXINFER, *args], stderr=subprocess.PIPE, text=True, timeout=120, preexec_fn=closed(1))
    assert r.returncode == 1 and r.stderr.count("\n") == 1, r.stderr
    assert r.stderr.startswith("error: cannot write the output: standard output is closed")


def test_a_closed_stdin_reads_as_empty_and_a_closed_stderr_keeps_stdout_clean(tmp_path):
    """Was: `-p - <&-` an AttributeError traceback ('NoneType' has no 'buffer'); with `2>&-` the stats line
    that goes to stderr was printed into stdout."""
    r = subprocess.run([MLXINFER, "topk", "-p", "-"], capture_output=True, text=True, timeout=120, preexec_fn=closed(0))
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert_one_line_error(r, "standard input (-p -) is empty")
    out = tmp_path / "out.json"
    with open(out, "w") as f:
        r = subprocess.run([MLXINFER, "count", "--json"], stdout=f, timeout=120, preexec_fn=closed(2))
    assert r.returncode == 0
    assert json.loads(out.read_text())["model"].startswith("SmolLM2")  # stdout holds the JSON alone


def test_a_deleted_current_directory_is_one_line(tmp_path):
    """Was: `serve`, `bench` and `quality` run from a directory deleted under the shell ended in a
    FileNotFoundError traceback from an import that resolves relative paths."""
    gone = tmp_path / "gone"
    gone.mkdir()
    r = subprocess.run(
        ["bash", "-c", f"cd {gone} && rmdir {gone} && exec {MLXINFER} serve --port 0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 2 and r.stdout == ""
    assert_one_line_error(r, "the current directory no longer exists")


@pytest.mark.parametrize("columns", ["0", "20"])
def test_an_unusable_terminal_width_still_shows_the_table(columns, monkeypatch):
    """Was: COLUMNS=0 printed nothing at all, exit 0; COLUMNS=20 printed a table of blank cells."""
    monkeypatch.setenv("COLUMNS", columns)
    r = invoke_cli("topk", "-p", "Name a herb for tomato soup.", "-n", "2")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("│ ")]
    assert len(rows) >= 2 and all("'" in row for row in rows[:2]), r.stdout  # each token row shows its token


def test_no_cell_is_cut_at_the_least_width(monkeypatch):
    """Was: at 60 columns sweep's intervals showed as "6.1%-79…" (and topk's tokens as 'Welco…'); a cell
    too wide for its column now folds onto a second line, so every character still shows."""
    monkeypatch.setenv("COLUMNS", "60")
    r = invoke_cli("sweep", "-p", "Name one fruit.", "--seeds", "3", "--max-tokens", "2")
    assert r.returncode == 0, r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("│ ")]
    assert rows and "…" not in r.stdout, r.stdout
    assert any("%" in row for row in rows), r.stdout


def test_lines_are_not_wrapped_where_the_output_is_not_a_terminal():
    """Was: piped into a file, `sample`'s completions were wrapped at 80 columns, one seed over several lines."""
    r = invoke_cli("sample", "-p", "Name a herb for tomato soup.", "--seeds", "4", "--max-tokens", "40")
    assert r.returncode == 0, r.stderr
    seeds = [line for line in r.stdout.splitlines() if line.startswith("seed ")]
    assert len(seeds) == 4 and max(map(len, seeds)) > 80, r.stdout  # whole lines, one a seed
    assert all(line.endswith(("'", '"')) for line in seeds), seeds  # each ends with its completion's closing quote


def test_json_stays_json_and_piped_text_is_read_where_stdout_and_stdin_are_not_utf8():
    """Was, under PYTHONIOENCODING=ascii: every --json output held `\\xfc` escapes (not JSON), and `chat` read
    a piped 'Grüß' into a UnicodeDecodeError traceback."""
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    prompt = "Nenne ein Kraut für Tomatensuppe."
    r = subprocess.run([MLXINFER, "topk", "-p", prompt, "-n", "2", "--json"], capture_output=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.isascii() and json.loads(r.stdout)["prompt"] == prompt
    r = subprocess.run(
        [MLXINFER, "chat", "--json", "--max-tokens", "2", "--seed", "1"],
        input="Grüß\n".encode(), capture_output=True, env=env, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["user"] == "Grüß"


def test_a_chat_line_that_is_not_utf8_is_named_as_the_line():
    """Was: "--prompt is not valid UTF-8 text" (chat has no --prompt); the chat goes on to the next line, and a
    piped one says at its end that a line failed (exit 2)."""
    r = subprocess.run(
        [MLXINFER, "chat", "--max-tokens", "1", "--seed", "1"], input=b"hi \xff\nhi\n", capture_output=True, timeout=120
    )
    assert r.returncode == 2 and r.stdout.strip(), r.stderr  # the second line's reply
    assert b"error: this line is not valid UTF-8 text" in r.stderr and b"--prompt" not in r.stderr


def test_a_reopened_stream_reaches_child_processes_and_serve_may_run_without_stdout():
    """A closed fd 0 is opened on /dev/null inheritable, so that a child (the native build, bench's runs) does
    not start with it closed; serve and explore write stdout only with --json, so `serve >&-` may run."""
    from mlxinfer_cli.app import _writes_stdout

    child = (
        "import os, subprocess, sys; print(subprocess.run([sys.executable, '-c', 'import os; os.fstat(0)']).returncode)"
    )
    probe = f"from mlxinfer_cli.app import _standard_streams; _standard_streams(); exec({child!r})"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, preexec_fn=closed(0))
    assert r.stdout.strip() == "0", r.stderr
    assert not _writes_stdout(["serve", "--port", "0"]) and not _writes_stdout(["--debug", "explore"])
    assert _writes_stdout(["serve", "--json"]) and _writes_stdout(["count"]) and _writes_stdout(["--help"])


def test_a_conversation_past_the_context_is_named_as_the_conversation(checkpoint_dir):
    """chat names what overflows: the whole conversation through the template, not a --prompt it has not got."""
    r = invoke_cli("chat", "-m", str(checkpoint_dir("llama")), "--max-tokens", "2", input="word " * 2000 + "\n")
    assert r.returncode == 2 and "1 line of the conversation failed" in r.stderr, r.stderr
    assert "error: the conversation is" in r.stderr and "context is 512" in r.stderr and "--prompt" not in r.stderr


def test_serve_json_keeps_stdout_to_its_one_line():
    """`serve --port 0 --json` prints where it listens as one JSON line; its log (uvicorn's access lines
    among it, which uvicorn writes to stdout) goes to stderr, so a script reading stdout reads JSON only."""
    import httpx

    with subprocess.Popen(
        [MLXINFER, "serve", "--port", "0", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as p:
        try:
            where = json.loads(p.stdout.readline())
            url = where.get("url") or f"http://{where['host']}:{where['port']}"
            assert httpx.get(f"{url.removesuffix('/v1')}/health", timeout=60).status_code == 200
        finally:
            p.terminate()
        out, err = p.communicate(timeout=60)
    assert out == "", out  # nothing after the JSON line: the access log went to stderr
    assert "GET /health" in err


def test_ctrl_c_before_a_command_runs_is_130_without_a_traceback():
    """Ctrl-C in the first ~0.2 s (Typer building the commands) printed a traceback: the script's entry
    installs a quiet SIGINT handler (exit 130) until a command is about to run, then hands SIGINT back to
    Python, so each command's own Ctrl-C handling sees KeyboardInterrupt as before. Timed in a subprocess
    it would be flaky; here the two halves, and an interrupt raised while Typer builds its commands."""
    import signal

    import typer.main

    import mlxinfer_cli
    from mlxinfer_cli import app as cli_app

    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, mlxinfer_cli._aborted)
        assert invoke_cli("count", str(Path(__file__).parent / "fixtures/configs/qwen3-0.6b.json")).returncode == 0
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # handed back to the command
        probe = subprocess.run(
            [sys.executable, "-c", "import signal, mlxinfer_cli; mlxinfer_cli._aborted(signal.SIGINT, None)"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert (probe.returncode, probe.stderr) == (130, "aborted\n")
    finally:
        signal.signal(signal.SIGINT, before)

    # a process started with SIGINT ignored (a script's background job) keeps it ignored, as before
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        saved_argv = sys.argv
        sys.argv = ["mlxinfer", "count", str(Path(__file__).parent / "fixtures/configs/qwen3-0.6b.json")]
        with pytest.raises(SystemExit) as done:
            mlxinfer_cli.main()
        assert done.value.code in (0, None) and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        sys.argv = saved_argv
        signal.signal(signal.SIGINT, before)

    def interrupted(*_):
        raise KeyboardInterrupt

    saved, argv = typer.main.get_command, sys.argv
    typer.main.get_command, sys.argv = interrupted, ["mlxinfer", "topk", "-p", "hi"]
    try:
        with pytest.raises(SystemExit) as e:
            cli_app.main()
    finally:
        typer.main.get_command, sys.argv = saved, argv
    assert e.value.code == 130


def _generate_stopped(*extra: str, after: float = 0.0) -> tuple[str, str, int, float]:
    """generate of a long story (seed 1) through pipes, Ctrl-C once some text is out (--json writes nothing
    before its end: `after` seconds from the start, once a run without it has shown when its text began):
    (stdout, stderr, exit code, seconds to the first text)."""
    import signal

    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlxinfer", "generate", "-p", "Tell me a long story.", "--max-tokens", "2000",
         "--temp", "1", "--seed", "1", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        first = ""
        if after:
            while proc.poll() is None and time.monotonic() - started < after:
                time.sleep(0.1)
            assert proc.poll() is None, "it ended before the interrupt"
        else:
            line = proc.stderr.readline()  # "[SmolLM2-135M-Instruct on ...]": written once the first token is
            while line and not line.startswith("["):  # (a kernel build's notes may come before it)
                line = proc.stderr.readline()
            first = proc.stdout.read(1)  # some text is out: the interrupt comes after it
        shown = time.monotonic() - started
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return first + out, err, proc.returncode, shown


def test_generate_stopped_by_ctrl_c_keeps_what_it_wrote():
    """Ctrl-C during generate: exit 130, and what was written is the result. Was: " [stopped]" written into the
    text a pipe receives, no stats line, and with --json nothing at all. Now a pipe gets the model's text alone
    (a newline ends it) and stderr the stats line with finish "interrupted"; --json prints the result so far
    with finish_reason "interrupted", its tokens the first of what the same seed writes uninterrupted; at a
    terminal the line is marked " [stopped]", as chat marks a stopped reply."""
    out, err, code, shown = _generate_stopped()
    assert code == 130 and "Traceback" not in err, err
    assert out.endswith("\n") and "[stopped]" not in out and len(out) > 1, out[-200:]
    assert "finish: interrupted" in err, err
    out, err, code, _ = _generate_stopped("--json", after=shown + 1.5)  # ~100 tokens in
    assert code == 130 and "Traceback" not in err, err
    got = json.loads(out)
    assert got["finish_reason"] == "interrupted" and got["stats"]["finish_reason"] == "interrupted"
    assert 0 < len(got["tokens"]) < 2000 and got["stats"]["generated_tokens"] == len(got["tokens"])
    model, tok = mlxinfer.load()
    whole = mlxinfer.generate(model, tok, "Tell me a long story.", max_tokens=len(got["tokens"]),
                              settings={"temperature": 1.0}, seed=1)  # fmt: skip
    assert whole.tokens == got["tokens"] and whole.text.startswith(got["text"])
    term = Terminal(
        "generate", "-p", "Tell me a long story.", "--max-tokens", "2000", "--temp", "1", "--seed", "1", cwd=str(ROOT)
    )
    try:
        term.expect(r"\[seed \d+\][^\n]*\n.")  # the first text is out
        term.send("\x03")
        term.expect(r" \[stopped\]\n")
        term.expect(r"finish: interrupted\n")
        assert term.wait() == 130
    finally:
        term.close()


def test_chat_reading_a_pipe_ends_on_ctrl_c():
    """At a terminal Ctrl-C at the prompt drops the line, as a shell does; reading a pipe there is no line
    to drop, and chat went on waiting, then exited 0. Now 130, as every command's Ctrl-C."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "mlxinfer", "chat", "--max-tokens", "4"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = proc.stderr.readline()  # "[model] /help lists the commands; ...": reading its input now
        while line and "/help" not in line:
            line = proc.stderr.readline()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130 and "Traceback" not in err, err
