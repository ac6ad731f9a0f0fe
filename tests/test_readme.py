"""The README's Python section runs as written, on the embedded model, so the docs cannot rot."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import ROOT


def readme_python() -> str:
    text = (ROOT / "README.md").read_text()
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
