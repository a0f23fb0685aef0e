"""mypy over the installed package names (recsys_doctor, .analyzers, .runtime, .reports).

pyproject.toml maps `recsys_doctor.analyzers` to the top-level folder `analyzers/` (and so for
runtime/ and reports/); the editable install resolves that with an import hook that mypy does
not follow. This script lays a tree of symbolic links under build/mypy-tree/ that has the
installed shape (read from [tool.setuptools.package-dir], so moves inside the folders need no
change here), runs mypy on it with the settings of [tool.mypy], and prints the errors with
their paths in the source tree. Exit code: mypy's.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

from mypy import api

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "mypy-tree"


def package_dirs() -> dict[str, Path]:
    """Installed package name -> its folder in the source tree (the setuptools mapping)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        mapping = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / folder for name, folder in mapping.items()}


def lay_tree(dirs: dict[str, Path]) -> dict[Path, Path]:
    """Link every entry of each mapped folder into TREE; return tree dir -> source dir."""
    roots: dict[Path, Path] = {}
    for name in sorted(dirs, key=lambda n: n.count(".")):
        dest = TREE.joinpath(*name.split("."))
        dest.mkdir(parents=True, exist_ok=True)
        roots[dest] = dirs[name]
        mapped = {n.split(".")[-1] for n in dirs if n.startswith(name + ".")}
        wanted = {p.name for p in dirs[name].iterdir()
                  if p.name not in mapped and p.name != "__pycache__"}
        for old in dest.iterdir():
            if old.is_symlink() and old.name not in wanted:
                old.unlink()
        for entry in wanted:
            link = dest / entry
            if not link.is_symlink():
                os.symlink(dirs[name] / entry, link)
    return roots


def main() -> int:
    if TREE.exists():
        # stale links of a renamed folder would otherwise be type-checked as well
        for path in sorted(TREE.rglob("*"), key=lambda p: -len(p.parts)):
            if path.is_symlink():
                path.unlink()
    roots = lay_tree(package_dirs())
    os.chdir(ROOT)
    out, err, status = api.run(["--config-file", str(ROOT / "pyproject.toml"),
                                "-p", "recsys_doctor", *sys.argv[1:]])
    for dest, src in sorted(roots.items(), key=lambda kv: -len(kv[0].parts)):
        out = out.replace(str(dest.relative_to(ROOT)) + os.sep,
                          str(src.relative_to(ROOT)) + os.sep)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return status


if __name__ == "__main__":
    sys.exit(main())
