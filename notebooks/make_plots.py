"""Regenerate the README's plot images by executing the notebooks top to bottom.

    python notebooks/make_plots.py                      # every notebook -> docs/images/*.png
    python notebooks/make_plots.py temperature          # just one (name with or without .ipynb)
    python notebooks/make_plots.py --executed out/      # also keep the executed copies in out/

Each notebook runs in a fresh `python3` kernel (this interpreter's ipykernel), from the notebooks
folder, on the model its parameter cell names (the embedded default unless edited). The notebook
files themselves are never rewritten: they stay committed without outputs. Needs the `notebooks`
extra: pip install -e '.[notebooks]'.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
IMAGES = HERE.parent / "docs" / "images"


def execute(path: Path, *, images: Path | None = None, timeout: int = 600, kernel: str = "python3"):
    """Execute a notebook in memory (from the notebooks folder) and return the executed copy."""
    import nbformat
    from nbclient import NotebookClient

    if images is not None:
        os.environ["MLXINFER_IMAGES"] = str(images)  # the kernel inherits this environment
    os.environ.setdefault("MPLBACKEND", "Agg")  # never a GUI backend, even before %matplotlib inline
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name=kernel, resources={"metadata": {"path": str(HERE)}}).execute()
    return nb


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="notebooks to run (default: all in notebooks/)")
    ap.add_argument("--images", type=Path, default=IMAGES, help=f"where the figures go (default {IMAGES})")
    ap.add_argument("--executed", type=Path, help="also write the executed notebooks (with outputs) here")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = ap.parse_args(argv)

    paths = [HERE / (n if n.endswith(".ipynb") else f"{n}.ipynb") for n in args.names] or sorted(HERE.glob("*.ipynb"))
    missing = [p.name for p in paths if not p.exists()]
    if missing:
        print(f"error: no notebook {', '.join(missing)} in {HERE}", file=sys.stderr)
        return 2
    args.images.mkdir(parents=True, exist_ok=True)
    if args.executed:
        args.executed.mkdir(parents=True, exist_ok=True)
    for path in paths:
        start = time.perf_counter()
        nb = execute(path, images=args.images.resolve(), timeout=args.timeout)
        if args.executed:
            import nbformat

            nbformat.write(nb, args.executed / path.name)
        print(f"{path.name}: executed in {time.perf_counter() - start:.0f} s")
    for image in sorted(args.images.glob("*.png")):
        print(f"  {image.relative_to(HERE.parent) if image.is_relative_to(HERE.parent) else image}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
