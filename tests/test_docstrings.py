"""Each package's docstring is its table of contents: it names every module in it (as ``name``), so a module
moved or added without a line there fails here, and no docstring names a module that is gone."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from labkit.lessons import NOTEBOOK

LABKIT = Path(__file__).resolve().parent.parent / "labkit"
PACKAGES = sorted(p.parent for p in LABKIT.rglob("__init__.py"))


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(LABKIT.parent)))
def test_a_package_docstring_names_every_module_in_it(package):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    if package == LABKIT / "lessons":  # one package per notebook (nbNN, nb03b), described as a family, not one by one
        modules = {m for m in modules if not NOTEBOOK.fullmatch(m)}
    named = set(re.findall(r"``([A-Za-z_][A-Za-z0-9_]*)``", doc))
    missing = sorted(m for m in modules if m not in named)
    assert not missing, f"{package.relative_to(LABKIT.parent)}'s docstring does not name {missing}"
    rows = re.findall(r"^\s*``([A-Za-z_][A-Za-z0-9_]*)``\s", doc, flags=re.M)  # the table's rows: one module each
    gone = sorted(set(rows) - modules)
    assert not gone, f"{package.relative_to(LABKIT.parent)}'s docstring lists modules that are not there: {gone}"
