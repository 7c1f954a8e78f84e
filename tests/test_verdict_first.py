"""The verdict-first rule: a takeaway module chooses every comparative or causal clause from ``labkit.core.verdict``,
never by comparing a measured ratio against a threshold of its own.

It reads every notebook's takeaways and runs (``labkit/lessons/nbNN/findings.py`` and ``runs.py``) and the findings
framework (``labkit/lessons/findings``). An ordering comparison (<, >, <=, >=) there is allowed only where it cannot pick a
comparative word from a measurement: one side is a count (``len(...)``), a set (inclusion), or the constant 0 (a
guard before a division), or the line says why it is a fact (``# fact: …``: bytes against a cache size, a count
against a count). The thresholds (``SLACK``, ``TIE``, ``TOLERANCE`` …) are read only by ``core/verdict.py``.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = ROOT / "labkit" / "lessons"
FINDINGS = sorted([*(LESSONS / "findings").rglob("*.py"), *LESSONS.glob("nb*/findings.py"), *LESSONS.glob("nb*/runs.py")])
ORDER = (ast.Lt, ast.Gt, ast.LtE, ast.GtE)
THRESHOLDS = {"SLACK", "TOLERANCE", "TIE", "ROUGH_SPREAD", "DRIFT_RANGE", "ANOMALY", "MIN_SAMPLES", "NOISE_SHARE",
              "OFF_BY"}


def _allowed_operand(node: ast.AST) -> bool:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("len", "set"):
        return True
    if isinstance(node, (ast.Set, ast.SetComp)):
        return True
    return isinstance(node, ast.Constant) and node.value == 0 and not isinstance(node.value, bool)


def violations(source: str, name: str = "<source>") -> list[str]:
    """Every ordering comparison and threshold read in ``source`` that the rule forbids, as 'name:line: code'."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, ORDER) for op in node.ops):
            operands = [node.left, *node.comparators]
            facts = [lines[i] for i in range(node.lineno - 1, (node.end_lineno or node.lineno))]
            if any(_allowed_operand(o) for o in operands) or any("# fact:" in line for line in facts):
                continue
            found.append((node.lineno, f"{name}:{node.lineno}: {ast.get_source_segment(source, node)}"))
        elif isinstance(node, (ast.Name, ast.Attribute)):
            ident = node.id if isinstance(node, ast.Name) else node.attr
            if ident in THRESHOLDS:
                found.append((node.lineno, f"{name}:{node.lineno}: reads the threshold {ident}: ask labkit.core.verdict "
                                           "instead"))
    return [said for _, said in sorted(found)]


def test_the_rule_reads_every_notebooks_findings_and_runs() -> None:
    """A lint that globs one folder goes blind when files move: count what it reads against the notebooks."""
    notebooks = {p.name.split("_")[0] for p in (ROOT / "notebooks" / "src").glob("*.py")}
    read = {p.relative_to(LESSONS).as_posix() for p in FINDINGS}
    assert {f"nb{nb}/findings.py" for nb in notebooks} <= read, sorted(read)
    runs = {p.parent.name for p in LESSONS.glob("nb*/runs.py")}
    assert len(read) == len(notebooks) + len(runs) + 1 and len(runs) >= 7, sorted(read)


@pytest.mark.parametrize("path", FINDINGS, ids=[p.relative_to(LESSONS).as_posix() for p in FINDINGS])
def test_no_findings_module_compares_a_measurement_against_its_own_threshold(path: Path) -> None:
    found = violations(path.read_text(encoding="utf-8"), path.name)
    assert not found, ("a takeaway picks its words from a verdict (verdict.compare, versus, largest, pick, doubts), "
                       "not from a threshold of its own:\n" + "\n".join(found))


def test_the_rule_catches_a_threshold_and_lets_counts_and_facts_pass() -> None:
    planted = ("word = 'faster' if gain > 1.05 else 'slower'\n"
               "ok = speedup > 1\n"
               "close = measured < expected / (1 + verdict.SLACK)\n"
               "n = len(rows) > 1\n"
               "fits = b <= cache  # fact: bytes against the cache's size\n"
               "safe = base <= 0\n"
               "both = {'a', 'b'} <= set(kinds)\n")
    found = violations(planted)
    assert [f.split(":")[1] for f in found] == ["1", "2", "3", "3"], found
