"""The folders of the package are the stages of the chain, and imports run one way, down.

Every module belongs to a stage by its folder (``recsys_doctor/<folder>/...``; the few
modules at the top level by their own name). A module imports only its own stage and those
below it: the orchestrating stage sits above what it calls (``profile`` captures and then
diagnoses, ``advise`` diagnoses and then asks the planner, ``apply`` plans, captures and
keeps history), so the chain reads top-down as the folders a newcomer opens. The import
graph is the one ``test_import_graph`` reads from the source with ``ast`` (imports inside
functions and under ``TYPE_CHECKING`` included).

Also here, the size rules: no module over 450 lines and no function over 70 in
recsys_doctor/, analyzers/, reports/ and runtime/, unless a ``# size:`` comment says why;
``python tests/test_stages.py`` lists whatever breaks them.
"""

from __future__ import annotations

from pathlib import Path

from test_import_graph import PACKAGE_DIRS, ROOT, import_edges, package_modules

#: the stages, lowest first: (name, the folders or top-level modules it holds).
#: ``recsys_doctor`` is the package's public face (its lazy ``__init__``), at the top.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("shared", ("_util", "errors", "model", "findings", "plan")),
    ("options", ("options",)),
    ("loaders", ("loaders",)),
    ("analyzers", ("analyzers",)),
    ("planning", ("planning",)),
    ("diagnose", ("diagnose",)),
    ("capture", ("capture",)),
    ("history", ("history", "gate")),
    ("reports", ("reports",)),
    ("runtime", ("runtime",)),
    ("applying", ("applying",)),
    ("cli", ("cli", "__main__", "__init__")),
)

#: modules directly under recsys_doctor/ (``__init__`` and ``__main__`` included)
MAX_TOP_LEVEL_MODULES = 10


def folder_of(module: str, top: str = "recsys_doctor") -> str:
    """``recsys_doctor.diagnose.advise`` -> ``diagnose``; the package itself -> ``__init__``."""
    parts = module.split(".")
    assert parts[0] == top, module
    return parts[1] if len(parts) > 1 else "__init__"


def stage_of(module: str, stages=STAGES, top: str = "recsys_doctor") -> int | None:
    folder = folder_of(module, top)
    return next((i for i, (_, folders) in enumerate(stages) if folder in folders), None)


def violations(edges: dict[str, set[str]], stages=STAGES, top: str = "recsys_doctor") -> list[str]:
    """Every module without a stage, and every import of a later stage."""
    out = []
    for m in sorted(edges):
        own = stage_of(m, stages, top)
        if own is None:
            out.append(f"{m}: its folder {folder_of(m, top)!r} is in no stage (add it to STAGES)")
            continue
        for t in sorted(edges[m]):
            theirs = stage_of(t, stages, top)
            if theirs is not None and theirs > own:
                out.append(f"{m} ({stages[own][0]}) imports {t} ({stages[theirs][0]})")
    return out


def test_no_stage_imports_a_later_one():
    bad = violations(import_edges(package_modules()))
    assert not bad, "\n".join(bad)


def test_every_stage_folder_exists():
    mods = package_modules()
    folders = {folder_of(m) for m in mods}
    for name, names in STAGES:
        for f in names:
            assert f in folders, f"stage {name}: no folder or module {f!r} (moved? update STAGES)"


def test_top_level_holds_at_most_ten_modules():
    top = sorted(p.name for p in PACKAGE_DIRS["recsys_doctor"].glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at recsys_doctor/'s top level: {top}"


def test_every_subpackage_says_what_it_owns_and_may_import():
    for init in sorted(PACKAGE_DIRS["recsys_doctor"].glob("*/__init__.py")):
        import ast

        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in doc.lower(), f"{init.relative_to(ROOT)}: the docstring does not say what it may import"


def test_checker_sees_an_import_up_the_chain_even_inside_a_function(tmp_path: Path):
    pkg = tmp_path / "pkg"
    for folder in ("low", "high"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "a.py").write_text("x = 1\n")
    (pkg / "high" / "b.py").write_text("from ..low import a\n")
    stages = (("low", ("low",)), ("high", ("high", "__init__")))
    mods = package_modules({"pkg": pkg})
    assert violations(import_edges(mods), stages, "pkg") == []  # high -> low: fine
    (pkg / "low" / "a.py").write_text("def f():\n    from ..high import b\n")
    (pkg / "odd").mkdir()
    (pkg / "odd" / "__init__.py").write_text("")
    mods = package_modules({"pkg": pkg})
    assert violations(import_edges(mods), stages, "pkg") == [
        "pkg.low.a (low) imports pkg.high.b (high)",
        "pkg.odd: its folder 'odd' is in no stage (add it to STAGES)",
    ]


# ---------------------------------------------------------------------------- sizes
#: the folders the size rules hold for
SIZED = ("recsys_doctor", "analyzers", "reports", "runtime")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 70
#: where a module or function is longer for a reason, the reason is a comment that starts
#: with this, on one of the module's first three lines or right under the function's signature
REASON = "# size:"


def size_violations(root: Path = ROOT, folders: tuple[str, ...] = SIZED) -> list[str]:
    """Every module over MAX_MODULE_LINES and every function over MAX_FUNCTION_LINES lines
    (its whole span, signature and docstring included) that gives no reason."""
    import ast

    out = []
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            text = path.read_text()
            lines = text.splitlines()
            rel = path.relative_to(root)
            if len(lines) > MAX_MODULE_LINES and not any(x.strip().startswith(REASON) for x in lines[:3]):
                out.append(f"{rel}: {len(lines)} lines")
            for node in ast.walk(ast.parse(text, str(path))):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                n = node.end_lineno - node.lineno + 1
                head = lines[node.lineno:node.body[0].lineno]  # after the def line, to the first statement
                if n > MAX_FUNCTION_LINES and not any(x.strip().startswith(REASON) for x in head):
                    out.append(f"{rel}:{node.lineno}: {node.name}() {n} lines")
    return out


def test_no_long_module_or_function_without_a_reason():
    bad = size_violations()
    assert not bad, "\n".join(bad)


def test_size_check_sees_a_long_function_and_reads_its_reason(tmp_path: Path):
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("def f():\n" + body)
    assert size_violations(tmp_path, ("pkg",)) == [f"pkg/m.py:1: f() {MAX_FUNCTION_LINES + 1} lines"]
    (tmp_path / "pkg" / "m.py").write_text("def f():\n    # size: one table of cases, read top-down\n" + body)
    assert size_violations(tmp_path, ("pkg",)) == []


if __name__ == "__main__":  # python tests/test_stages.py: the size rules' violations, one a line
    print("\n".join(size_violations()) or "no violations")
