"""The README keeps its word: its first two commands are the project's run and test commands, every
`mlxinfer ...` line shown in it and in docs/ parses against the CLI as it is, the cheap ones run on the
embedded model and print the numbers their comments promise, its links resolve, and its Python
section runs as written."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
from conftest import ROOT, invoke_cli

README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
# written beside the README by others: a link may arrive before its page does
PARALLEL = {ROOT / "docs" / "explorer.md", ROOT / "docs" / "chat.md"}
# run where a README line shows them on the embedded model: a forward pass or a few dozen tokens each
CHEAP = {"count", "topk", "tokens", "sample", "answers", "generate", "info"}
NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced block."""
    return re.findall(r"^```(\w*)\n(.*?)^```", text, flags=re.S | re.M)


def shown_commands(text: str) -> list[tuple[list[str], str]]:
    """Every mlxinfer command line in the fenced blocks, as (its words after `mlxinfer`, its comment):
    lines of shell blocks, and `$ ` lines of any block; `-m mlxinfer` after mlx.launch too."""
    found = []
    for lang, body in code_blocks(text):
        if lang == "python":
            continue
        for line in re.sub(r"\\\n\s*", " ", body).splitlines():
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            elif lang != "sh" or "mlxinfer" not in line:
                continue
            words = shlex.split(line, comments=True)
            if "mlxinfer" not in words:
                continue
            at = words.index("mlxinfer")
            if at == 0 or words[at - 1] == "-m":
                comment = line.split(" # ", 1)[1] if " # " in line else ""
                found.append((words[at + 1 :], comment))
    return found


def parse(words: list[str]) -> None:
    """Click's parse of the command line, without running it: an unknown command or flag, a missing
    argument or a value of the wrong type raises click.UsageError."""
    import typer.main

    from mlxinfer_cli.app import app

    group = typer.main.get_command(app)
    assert words and words[0] in group.commands, f"no command {words[:1]} (mlxinfer --help lists them)"
    group.commands[words[0]].make_context(words[0], list(words[1:]))


def test_the_first_two_commands_run_the_main_job_and_the_tests():
    first = next(body for lang, body in code_blocks(README.read_text()) if lang == "sh")
    assert [line.split("#")[0].strip() for line in first.splitlines() if line.strip()] == ["make run", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text().splitlines()  # CI runs the README's test command
    make = (ROOT / "Makefile").read_text()
    run = make[make.index("\nrun:") :].split("\n\n")[0]
    assert '$(BIN)/mlxinfer topk --prompt "$(HERB)"' in run and '$(BIN)/mlxinfer topk --prompt "$(FRUIT)"' in run
    assert "HERB := Name one herb to add to tomato soup. Answer with one word." in make  # the lesson's prompts
    assert "FRUIT := Name one fruit. Answer with one word." in make


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_shown_parses(page):
    shown = shown_commands(page.read_text())
    if page == README:  # the tour shows every command the CLI has
        import typer.main

        from mlxinfer_cli.app import app

        assert {w[0] for w, _ in shown} >= set(typer.main.get_command(app).commands)
    for words, _ in shown:
        try:
            parse(words)
        except click.UsageError as e:
            pytest.fail(f"{page.name}: mlxinfer {shlex.join(words)}: {e.format_message()}")


def test_a_broken_command_line_is_caught():
    """The parse above is a real check: a flag that is not there, or a value of the wrong type, fails."""
    for words in (
        ["topk", "--prompt", "x", "--no-such-flag"],
        ["sample", "--prompt", "x", "--max-tokens", "ten"],
        ["chatty"],
    ):
        with pytest.raises((click.UsageError, AssertionError)):
            parse(words)


def _runnable(words: list[str]) -> bool:
    """A cheap command on the embedded model (no --model, no output file) whose paths all exist."""
    if words[0] not in CHEAP or {"--model", "-m", "--out"} & set(words):
        return False
    return all(Path(ROOT / w).exists() for w in words[1:] if "/" in w and not w.startswith("-"))


@pytest.mark.slow
def test_the_cheap_commands_run_and_print_what_their_comments_say():
    ran = 0
    for words, comment in shown_commands(README.read_text()):
        if not _runnable(words):
            continue
        result = invoke_cli(*words)
        assert result.returncode == 0, (words, result.stderr)
        for number in NUMBER.findall(comment):  # "TOTAL = 596,049,920": the lesson's figure, printed
            assert number in result.stdout, (words, number)
        ran += 1
    assert ran >= 6


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    prose = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    return {_slug(h) for h in re.findall(r"^#+ (.+)$", prose, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_resolve(page):
    prose = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", prose):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if path in PARALLEL and not path.exists():
            continue
        assert path.exists(), f"{page.name} links to {target}, which is not there"
        if anchor and path.suffix == ".md":
            assert anchor in _anchors(path), f"{page.name} links to {target}: no such heading"


def readme_python() -> str:
    text = README.read_text()
    section = text[text.index("## Python API") :]
    section = section[: section.index("\n## ", 1)]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, "the Python section holds one python block"
    return blocks[0]


@pytest.mark.slow
def test_the_python_section_runs_as_written():
    code = readme_python()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "SmolLM2-135M-Instruct (Q4_1 GGUF, embedded default) mlxinfer llama" in out
    assert "The fruit I'm referring to is the fruit of the blackcurrant" in out  # llama.cpp's greedy answer
    assert '{"items":[{"name":"Basil","quantity":1,"unit":"g"}]} True' in out  # the lesson's tool, schema-valid
    assert re.search(r"^134,515,008 parameters", out, flags=re.M), out
    assert re.search(r"^\[\('The', None\), \(' capital', [\d.e-]+\).*\] perplexity \d", out, flags=re.M), out
    assert re.search(r"^0\.5 \[\('", out, flags=re.M) and re.search(r"^1\.0 \[\('", out, flags=re.M), out  # sweep
