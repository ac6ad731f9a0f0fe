"""The notebooks: committed without outputs, and each one runs top to bottom on the embedded model.

Execution needs the `notebooks` extra (nbclient, nbformat, ipykernel, matplotlib, ipywidgets);
without it those tests skip and say so. Each notebook runs in a fresh `python3` kernel from the
notebooks folder, in memory: the committed file is never rewritten (an executed copy is written to
the test's temporary folder, for looking at when a test fails). Figures go to a temporary folder
too (MLXINFER_IMAGES), not to docs/images.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK_DIR = ROOT / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
# notebook -> the main figure it saves for the README
FIGURES = {
    "temperature.ipynb": "temperature.png",
    "seeded_sampling.ipynb": "seeded_sampling.png",
    "forward_pass.ipynb": "forward_pass.png",
}
CELL_TIMEOUT = 300  # seconds, per cell


def test_the_notebooks_are_there():
    assert {p.name for p in NOTEBOOKS} == set(FIGURES)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    """Strip before committing: `jupyter nbconvert --clear-output --inplace notebooks/*.ipynb`."""
    nb = json.loads(path.read_text())
    dirty = [
        i
        for i, cell in enumerate(nb["cells"])
        if cell["cell_type"] == "code" and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]
    assert not dirty, f"{path.name}: cells {dirty} have outputs or execution counts; clear them before committing"
    assert "widgets" not in nb.get("metadata", {}), f"{path.name}: saved widget state in the metadata; clear it"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_starts_with_a_parameter_cell_on_the_embedded_model(path):
    nb = json.loads(path.read_text())
    first_code = next(c for c in nb["cells"] if c["cell_type"] == "code")
    source = "".join(first_code["source"])
    assert "parameters" in first_code["metadata"].get("tags", []), path.name
    assert "MODEL = None" in source and "Qwen3" in source, path.name  # embedded by default; a Mac model shown


@pytest.fixture(scope="module")
def kernel():
    for module in ("nbclient", "nbformat", "ipykernel", "matplotlib", "ipywidgets"):
        pytest.importorskip(module, reason=f"{module} is missing; pip install -e '.[notebooks]'")
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    # jupyter_client swaps a bare "python" for this interpreter; anything else would be another Python
    assert spec.argv[0] in ("python", "python3", sys.executable), (
        f"the python3 kernel runs {spec.argv[0]}, not this interpreter ({sys.executable}); "
        "remove the user-level python3 kernelspec or install ipykernel in this environment"
    )
    return "python3"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_executes_top_to_bottom(path, kernel, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    images = tmp_path / "images"
    monkeypatch.setenv("MLXINFER_IMAGES", str(images))  # the kernel inherits the environment
    monkeypatch.setenv("MPLBACKEND", "Agg")  # never a GUI backend
    committed = hashlib.sha256(path.read_bytes()).hexdigest()

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb, timeout=CELL_TIMEOUT, kernel_name=kernel, resources={"metadata": {"path": str(NOTEBOOK_DIR)}}
    )
    start = time.perf_counter()
    try:
        client.execute()
    finally:
        nbformat.write(nb, tmp_path / path.name)  # the executed copy, outputs and all
    seconds = time.perf_counter() - start

    assert hashlib.sha256(path.read_bytes()).hexdigest() == committed, "executing must not rewrite the notebook"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    figures = [o for c in code for o in c.outputs if "image/png" in o.get("data", {})]
    assert figures, f"{path.name} drew no figure"
    saved = images / FIGURES[path.name]
    assert saved.is_file() and saved.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{saved} was not written"
    print(f"{path.name}: {seconds:.0f} s, {len(figures)} figures")
