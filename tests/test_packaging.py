"""What `pip install` puts on a user's path: only the project's own names (mlxinfer, mlxinfer_cli,
mlxinfer_quant), never a plain `cli` or `quant` that would shadow another distribution's."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"mlxinfer": "mlxinfer", "cli": "mlxinfer_cli", "quant": "mlxinfer_quant"}  # folder -> installed name


def packages_on_disk() -> set[str]:
    found = set()
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    return found


def test_every_package_folder_is_listed_under_its_installed_name():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(meta["packages"]) == packages_on_disk()  # a new subpackage left out would be missing from a wheel
    assert meta["package-dir"] == {"mlxinfer_cli": "cli", "mlxinfer_quant": "quant"}


def test_installed_names_import_and_plain_ones_do_not(tmp_path):
    code = (
        "import importlib.util as u\n"
        "print([n for n in ('mlxinfer', 'mlxinfer_cli', 'mlxinfer_quant', 'cli', 'quant') if u.find_spec(n)])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['mlxinfer', 'mlxinfer_cli', 'mlxinfer_quant']"


def test_the_wheel_holds_only_the_projects_names(tmp_path):
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    source = tmp_path / "source"  # a copy of what is committed: no build/ left over from an earlier build
    for name in tracked + ["tests/test_packaging.py"]:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(source)]
    done = subprocess.run(build, capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    (wheel,) = tmp_path.glob("mlxinfer-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"mlxinfer", "mlxinfer_cli", "mlxinfer_quant"}
    # what the package needs at run time rides along: the explorer page, the kernel sources, the quality text
    assert {
        "mlxinfer/server/static/index.html",
        "mlxinfer_quant/data/eval.txt",
        "mlxinfer_cli/commands/chat.py",
    } <= set(names)
    assert any(n.startswith("mlxinfer/cpu/native/qmm/") and n.endswith(".cpp") for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "mlxinfer = mlxinfer_cli:main" in zipfile.ZipFile(wheel).read(entry).decode()
