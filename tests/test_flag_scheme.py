"""One flag scheme: plural flags take a list, singular ones one value, a rate takes a unit; the old
spellings (topk -k, bench's bare GB/s number, sample --seed-range) still work for a release, each with
one deprecation line on stderr."""

from __future__ import annotations

import json

import pytest
import typer
from conftest import assert_one_line_error, invoke_cli

FRUIT = "Name one fruit. Answer with one word."


def notes(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip()]


def test_topk_rows_and_the_old_k_give_the_same_table_and_k_says_it_is_deprecated():
    new = invoke_cli("topk", "-p", FRUIT, "--rows", "3", "--json")
    short = invoke_cli("topk", "-p", FRUIT, "-n", "3", "--json")
    old = invoke_cli("topk", "-p", FRUIT, "-k", "3", "--json")
    six = invoke_cli("topk", "-p", FRUIT, "--json")  # the default, 6 rows
    assert new.returncode == old.returncode == short.returncode == six.returncode == 0, old.stderr
    table = json.loads(new.stdout)
    assert len(table["rows"]) == 3
    assert json.loads(old.stdout) == table == json.loads(short.stdout)
    assert json.loads(six.stdout)["rows"][:3] == table["rows"]  # the first three of the longer table
    assert notes(new.stderr) == []
    assert notes(old.stderr) == ["note: -k is now --rows; -k will go in a later release"]


def test_topk_rows_bad_values_and_both_spellings_are_one_error_line():
    assert_one_line_error(invoke_cli("topk", "-p", FRUIT, "--rows", "0"), "--rows must be between 1 and")
    assert_one_line_error(invoke_cli("topk", "-p", FRUIT, "-k", "0"), "-k must be between 1 and")  # as typed
    assert_one_line_error(invoke_cli("topk", "-p", FRUIT, "-k", "2", "--rows", "3"), "--rows", "-k")


def test_bench_bandwidth_reads_counts_units_and_a_bare_number_as_gb_s():
    from mlxinfer_cli import flags
    from mlxinfer_cli.commands.bench import bandwidth_gb_s

    flags._notes.clear()
    assert bandwidth_gb_s("5GB/s") == 5.0
    assert bandwidth_gb_s("0.4TB/s") == pytest.approx(400.0)
    assert bandwidth_gb_s("4000MB/s") == pytest.approx(4.0)
    assert bandwidth_gb_s("1GiB/s") == pytest.approx(2**30 / 1e9)
    assert flags._notes == []
    assert bandwidth_gb_s("5") == 5.0  # the old spelling: GB/s
    assert flags._notes == ["note: --bandwidth 5 is now --bandwidth 5GB/s; a bare number will go in a later release"]
    flags._notes.clear()


@pytest.mark.parametrize(
    "value,fragment",
    [("fast", "cannot read --bandwidth 'fast'"), ("inf", "positive"), ("-1", "positive"), ("5flop/s", "cannot read")],
)
def test_bench_bad_bandwidth_is_one_error_line_before_any_model_loads(value, fragment):
    assert_one_line_error(invoke_cli("bench", "--bandwidth", value), fragment)


def test_seed_range_note_comes_only_when_the_command_succeeds():
    ok = invoke_cli("sample", "-p", FRUIT, "--seed-range", "0:2", "--max-tokens", "2", "--json")
    assert ok.returncode == 0, ok.stderr
    assert [c["seed"] for c in json.loads(ok.stdout)["completions"]] == [0, 1]
    assert notes(ok.stderr) == ["note: --seed-range is now --seeds A:B; --seed-range will go in a later release"]
    assert_one_line_error(invoke_cli("sample", "-p", FRUIT, "--seed-range", "0:2", "--top-p", "5"), "--top-p")
    both = invoke_cli("sample", "-p", FRUIT, "--seeds", "2", "--seed-range", "0:3")  # was "give --seeds N ..."
    assert_one_line_error(both, "--seeds and --seed-range both given; pass one")


def test_list_and_one_value_flags_say_which_in_their_first_words():
    from mlxinfer_cli.app import app

    commands = typer.main.get_command(app).commands
    for name in ("topk", "answers"):
        params = {p.opts[0]: p for p in commands[name].params}
        assert params["--temps"].help.startswith("Columns: a list of temperatures"), name
        assert params["--temp"].help.startswith("The sampler's temperature (one value)"), name
    topk = {o: p for p in commands["topk"].params for o in p.opts}
    assert topk["--rows"] is topk["-n"] and not topk["--rows"].hidden
    assert topk["-k"].hidden
    bench = {p.opts[0]: p for p in commands["bench"].params}
    assert "GB/s" in bench["--bandwidth"].help and bench["--bandwidth"].type.name == "text"


def test_every_prompt_file_flag_has_llama_cpps_short_name():
    """llama.cpp's -f is --prompt-file on every command that reads one (was: sweep's alone had no -f)."""
    from mlxinfer_cli.app import app

    with_file = {
        name: {o for p in command.params for o in p.opts}
        for name, command in typer.main.get_command(app).commands.items()
        if any("--prompt-file" in p.opts for p in command.params)
    }
    assert {"topk", "generate", "sample", "sweep", "answers", "tokens"} <= set(with_file)
    assert [name for name, opts in with_file.items() if "-f" not in opts] == []


def test_positional_arguments_show_their_help():
    """click 8.5 resets the help Typer gives a positional argument; the commands put it back."""
    shown = " ".join(invoke_cli("convert", "--help").stdout.split())
    assert "A .gguf file" in shown and "The directory to write" in shown
    assert "a local directory" in " ".join(invoke_cli("count", "--help").stdout.split())


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["generate", "--n-predict", "8"], "--n-predict is llama.cpp's flag; here use --max-tokens"),
        (["generate", "-p", "hi", "-ngl", "0"], "-ngl is llama.cpp's flag, and mlxinfer has no such setting"),
        (["generate", "-r", "User:"], "here use --stop"),
        (["serve", "--parallel", "4"], "here use --max-rows"),
        (["sample", "--seed", "3"], "seed 3 alone: --seeds 3:4"),
        (["quantize", "embedded", "out", "Q4_K_M"], "Q4_K_M is a GGUF type"),
        (["generate", "-"], "standard input is -p -"),
        # were Click's guesses (--jinja: '--json'?, --chat-template: '--temperature'?) or a misread (-sys: -s 'ys')
        (["generate", "-p", "hi", "-sys", "Be brief."], "-sys is llama.cpp's flag; here use --system TEXT"),
        (["generate", "-p", "hi", "--jinja"], "chat template always renders"),
        (["generate", "-p", "hi", "--system-prompt", "x"], "here use --system TEXT"),
        (["generate", "-p", "hi", "--ignore-chat-template"], "here use --no-chat"),
        (["generate", "-p", "hi", "-cnv"], "mlxinfer chat"),
        (["generate", "-p", "hi", "--verbose"], "mlx-lm's flag"),
        (["generate", "-p", "hi", "-n", "-1"], "llama.cpp's no limit"),
        (["generate", "-p", "hi", "--seed", "-1"], "leave it out for a fresh one"),
    ],
)
def test_another_tools_flag_is_named_with_what_to_type_here(args, fragment):
    """llama.cpp's and mlx-lm's habits get their equivalent, where Click guessed a near spelling
    (--n-predict: --no-chat?) or misread one (-ngl 0: -n 'gl')."""
    assert_one_line_error(invoke_cli(*args), fragment)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["serve", "--seed", "3"], "No such option '--seed'"),  # serve has no --seeds to suggest
        (["topk", "-p", "hi", "-r", "x"], "No such option '-r'"),  # nor topk a --stop
        (["generate", "-p", "-c", "--max-tokns", "5"], "Did you mean '--max-tokens'?"),  # -c is the prompt's text
    ],
)
def test_a_hint_never_names_a_flag_the_command_lacks_nor_reads_a_value_as_a_flag(args, fragment):
    result = invoke_cli(*args)
    assert_one_line_error(result, fragment)
    assert "flag" not in result.stderr


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["generate", "-fa"], "-fa is llama.cpp's flag, and mlxinfer has no such setting"),  # was: -f a, read
        (["generate", "-p", "hi", "-no-cnv"], "mlxinfer chat"),  # was: --max-tokens 'o-cnv'
        (["generate", "-p", "hi", "-ns", "2"], "-ns is llama.cpp's flag, and this command has no such setting"),
        (["sample", "-p", "hi", "-ns", "2"], "here use --seeds N"),
        (["generate", "-hf", "org/model"], "here use --model REPO"),  # was: No such option '-h'
        (["generate", "-p", "hi", "-ctk", "q8_0"], "KV cache"),  # was: No such option '-c'
        (["generate", "--stop", "--", "-fa"], "-fa is llama.cpp's flag"),  # -- is --stop's value here
    ],
)
def test_another_tools_flag_of_several_letters_is_never_read_as_short_flags(tmp_path, monkeypatch, args, fragment):
    """Click reads -fa as -f a: with a file named "a" in the folder, `generate -fa` took it as the prompt."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a").write_text("A-file")
    assert_one_line_error(invoke_cli(*args), fragment)


def test_such_a_flags_name_as_a_value_is_text():
    for args in (["-p", "-fa"], ["--prompt=-fa"], ["-p", "x", "--", "-fa"]):
        r = invoke_cli("tokens", *args, "--no-chat", "--json")
        assert "llama.cpp" not in r.stderr, (args, r.stderr)
    assert json.loads(invoke_cli("tokens", "--prompt=-fa", "--no-chat", "--json").stdout)["prompt"] == "-fa"


def test_a_commands_own_flag_is_never_taken_for_another_commands():
    """generate has --seed (sample's hint names it): a bad value there is generate's own error."""
    result = invoke_cli("generate", "-p", FRUIT, "--seed", "x")
    assert_one_line_error(result, "'x' is not a valid integer")
    assert "--seeds" not in result.stderr


def test_a_word_in_the_users_path_is_not_a_flag(tmp_path, monkeypatch):
    """Was: `quantize embedded out` (out/ not empty) said "/.../OUT exists ...; or choose another out", a folder
    named force became "/.../--force", and sweep's --out resume "--out --resume already holds results"."""
    from mlxinfer_cli import flags

    flags.use(out="OUT")
    try:
        said = flags.named("/data/out exists and is not empty; pass force, or choose another out", "force", "out")
        assert said == "/data/out exists and is not empty; pass --force, or choose another OUT"
        said = flags.named("/data/force exists; pass force to replace it", "force")
        assert said == "/data/force exists; pass --force to replace it"
    finally:
        flags._overrides.clear()
    monkeypatch.chdir(tmp_path)
    assert invoke_cli("sweep", "-p", "hi", "--seeds", "1", "-n", "1", "--out", "resume").returncode == 0
    again = invoke_cli("sweep", "-p", "hi", "--seeds", "1", "-n", "1", "--out", "resume")
    assert_one_line_error(again, "--out ./resume already holds results; pass --resume to continue")


def test_h_is_help_for_the_app_and_every_command():
    """Was: "No such option '-h'" everywhere (llama.cpp's and most tools' help flag)."""
    from mlxinfer_cli.app import app
    from typer.main import get_command

    assert invoke_cli("-h").stdout == invoke_cli("--help").stdout != ""
    for name in get_command(app).commands:
        r = invoke_cli(name, "-h")
        assert r.returncode == 0 and r.stdout == invoke_cli(name, "--help").stdout, name
