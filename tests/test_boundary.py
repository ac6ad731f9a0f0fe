"""The public boundary and the layers, read from the source (ast), not from a running import.

- The CLI, bench/, examples/ and the notebooks use only what `mlxinfer` and `mlxinfer_quant` export (their
  `__all__`): no `from mlxinfer.engine.x import y`, no `mlxinfer.settings.user_settings`.
- Inside the library a module imports only its own layer and the layers below it (LAYERS, bottom
  first; the same order as the README's architecture section).
- No import cycle anywhere in mlxinfer/, quant/ and cli/, lazy (function-level) imports included.

Each rule is also run on a small planted tree that breaks it, so the checks are shown to fail.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import mlxinfer
import mlxinfer_quant as quant

ROOT = Path(__file__).resolve().parents[1]

LAYERS = [  # bottom first; a module may import its own layer and those below
    ["errors", "defaults", "atomic", "keychain", "views", "brief", "plain", "chat_template", "open_files"],  # leaves
    ["formats", "settings", "cpu"],
    ["counting", "tokenizer", "tokenizer_load", "gguf_tokenizer", "sampler"],
    ["model"],
    ["engine"],
    ["server"],
]
PUBLIC_MODULES = {"mlxinfer.sampler", "mlxinfer.defaults"}  # public whole (mlxinfer's docstring)
FACADE = {"mlxinfer", "mlxinfer.__main__"}  # the lazy export table and `python -m mlxinfer`


INSTALLED = {"cli": "mlxinfer_cli", "quant": "mlxinfer_quant"}  # folder -> the name it installs as (pyproject)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    parts[0] = INSTALLED.get(parts[0], parts[0])
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(tree: ast.AST, module: str, is_package: bool) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import statement, lazy ones too."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            out.append((target, [a.name for a in node.names], node.lineno))
    return out


def code_of(path: Path) -> str:
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        return "\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!")))
    return path.read_text()


def boundary_problems(files: list[Path], exports: dict[str, set[str]]) -> list[str]:
    """Front-end files reaching past `mlxinfer`/`quant`'s exports."""
    problems = []
    for path in files:
        tree = ast.parse(code_of(path))
        for target, names, line in imports(tree, "", False):
            top = target.split(".")[0]
            if top not in exports:
                continue
            if target in PUBLIC_MODULES:
                continue
            if target != top:
                problems.append(f"{path.name}:{line} imports {target}: use what {top} exports")
            problems += [f"{path.name}:{line} imports {top}.{n}, not exported" for n in names if n not in exports[top]]
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in exports:
                if node.attr not in exports[node.value.id]:
                    problems.append(f"{path.name}:{node.lineno} uses {node.value.id}.{node.attr}, not exported")
    return problems


def graph(packages: list[Path], root: Path) -> dict[str, set[str]]:
    """module -> the project modules it imports (a name imported from a package counts as its module
    when it is one)."""
    files = {module_name(p, root): p for pkg in packages for p in pkg.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for module, path in files.items():
        deps = set()
        for target, names, _ in imports(ast.parse(path.read_text()), module, path.name == "__init__.py"):
            for dep in [f"{target}.{n}" for n in names if f"{target}.{n}" in files] or [target]:
                while dep and dep not in files:
                    dep = dep.rpartition(".")[0]
                if dep and dep != module:
                    deps.add(dep)
        edges[module] = deps
    return edges


def layer_problems(edges: dict[str, set[str]], package: str = "mlxinfer") -> list[str]:
    rank = {name: i for i, layer in enumerate(LAYERS) for name in layer}
    problems = []
    for module, deps in edges.items():
        if module in FACADE or not module.startswith(package + "."):
            continue
        here = module.split(".")[1]
        if here not in rank:
            problems.append(f"{module} is in no layer: add {here} to LAYERS (and the README)")
            continue
        for dep in deps:
            if dep in FACADE:
                problems.append(f"{module} imports the facade {dep}: import the module it names")
            elif dep.startswith(package + "."):
                there = dep.split(".")[1]
                if rank.get(there, -1) > rank[here]:
                    problems.append(f"{module} ({here}) imports {dep} ({there}), a layer above it")
            elif dep.split(".")[0] in ("mlxinfer_cli", "bench"):
                problems.append(f"{module} imports {dep}, which stands on the library")
    return problems


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in list(edges):
        if v not in index:
            visit(v)
    return found


def front_end_files() -> list[Path]:
    return [
        *(ROOT / "cli").rglob("*.py"),
        *(ROOT / "bench").glob("*.py"),
        *(ROOT / "examples").glob("*.py"),
        *(ROOT / "notebooks").glob("*.ipynb"),
        *(ROOT / "notebooks").glob("*.py"),
    ]


EXPORTS = {"mlxinfer": set(mlxinfer.__all__), "mlxinfer_quant": set(quant.__all__)}


def test_front_ends_use_only_the_exports():
    assert boundary_problems(front_end_files(), EXPORTS) == []


def test_every_export_resolves():
    missing = [n for n in mlxinfer.__all__ if getattr(mlxinfer, n, None) is None]
    missing += [n for n in quant.__all__ if getattr(quant, n, None) is None]
    assert missing == []


def test_library_layers_run_bottom_up_and_nothing_cycles():
    edges = graph([ROOT / "mlxinfer", ROOT / "quant", ROOT / "cli"], ROOT)
    assert layer_problems(edges) == []
    assert cycles(edges) == []


def test_the_checks_fail_on_planted_bad_imports(tmp_path):
    lib = tmp_path / "mlxinfer"
    for sub in ("engine", "model", "formats"):
        (lib / sub).mkdir(parents=True)
        (lib / sub / "__init__.py").write_text("")
    (lib / "__init__.py").write_text("")
    (lib / "formats" / "gguf.py").write_text("from ..engine import decode\n")  # down -> up
    (lib / "engine" / "decode.py").write_text("def f():\n    from ..model import a\n")  # lazy: still an edge
    (lib / "model" / "a.py").write_text("from ..engine.decode import f\n")  # closes a cycle
    front = tmp_path / "cli_cmd.py"
    front.write_text("from mlxinfer.engine.sweep import sweep\nimport mlxinfer\nmlxinfer.settings.user_settings\n")

    edges = graph([lib], tmp_path)
    assert sorted(layer_problems(edges)) == [
        "mlxinfer.formats.gguf (formats) imports mlxinfer.engine.decode (engine), a layer above it",
        "mlxinfer.model.a (model) imports mlxinfer.engine.decode (engine), a layer above it",
    ]
    assert cycles(edges) == [["mlxinfer.engine.decode", "mlxinfer.model.a"]]
    assert boundary_problems([front], {"mlxinfer": {"sweep"}}) == [
        "cli_cmd.py:1 imports mlxinfer.engine.sweep: use what mlxinfer exports",
        "cli_cmd.py:3 uses mlxinfer.settings, not exported",
    ]
