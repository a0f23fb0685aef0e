"""The package's modules import one another in one direction: no cycles.

The graph is read from the source with ``ast`` (nothing is imported), counting every
``import``/``from ... import`` in a module, including those inside functions: a lazy
import still ties two modules together, it only hides the cycle until run time.
"""

from __future__ import annotations

import ast
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
# setuptools package-dir: these folders install under recsys_doctor.<name>
PACKAGE_DIRS = {
    "recsys_doctor": ROOT / "recsys_doctor",
    "recsys_doctor.analyzers": ROOT / "analyzers",
    "recsys_doctor.runtime": ROOT / "runtime",
    "recsys_doctor.reports": ROOT / "reports",
}


def package_modules(dirs: dict[str, Path] = PACKAGE_DIRS) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is_package) for every .py file under the package folders."""
    mods: dict[str, tuple[Path, bool]] = {}
    for prefix, base in dirs.items():
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = list(rel.parts)
            is_pkg = parts[-1] == "__init__"
            if is_pkg:
                parts = parts[:-1]
            name = ".".join([prefix, *parts]) if parts else prefix
            mods.setdefault(name, (path, is_pkg))
        for path in sorted(base.rglob("*.c")):  # a C extension module: imports nothing of ours
            rel = path.relative_to(base).with_suffix("")
            mods.setdefault(".".join([prefix, *rel.parts]), (path, False))
    return mods


def import_edges(mods: dict[str, tuple[Path, bool]]) -> dict[str, set[str]]:
    """Module -> the package modules it imports (anywhere in its body)."""
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for name, (path, is_pkg) in mods.items():
        if path.suffix != ".py":
            continue
        package = name if is_pkg else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base_parts = package.split(".")
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                # `from pkg import sub` imports the submodule where one exists
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t and t not in mods:
                    t = t.rpartition(".")[0]
                if t and t != name:
                    edges[name].add(t)
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (first repeated at the end), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_modules_are_found():
    mods = package_modules()
    # each installed folder contributes its modules under the right name
    for name in ("recsys_doctor.applying.apply", "recsys_doctor.capture", "recsys_doctor.runtime.torch_adapter",
                 "recsys_doctor.analyzers", "recsys_doctor.reports.html", "recsys_doctor.loaders"):
        assert name in mods, name


def test_no_import_cycle_among_package_modules():
    cycle = find_cycle(import_edges(package_modules()))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_cycle_finder_sees_lazy_and_relative_imports(tmp_path):
    """The checker itself can fail: a function-level relative import back makes a cycle."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import x\n    return x\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    edges = import_edges(package_modules({"pkg": pkg}))
    assert edges["pkg.a"] == {"pkg.sub.b"}
    assert edges["pkg.sub.b"] == {"pkg.a"}
    assert edges["pkg.c"] == {"pkg.a"}
    assert find_cycle(edges) == ["pkg.a", "pkg.sub.b", "pkg.a"]
    (pkg / "sub" / "b.py").write_text("x = 1\n")
    assert find_cycle(import_edges(package_modules({"pkg": pkg}))) is None

