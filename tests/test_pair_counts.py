"""Notebooks 02–05 time their comparisons in rounds that pair up: at least ``verdict.MIN_PAIRS`` pairs in quick mode and
8 in full mode, and 03/03b score the prompts a verdict on their KL needs (``verdict.MIN_SAMPLES``)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from labkit.core import verdict

SRC = Path(__file__).resolve().parents[1] / "notebooks" / "src"
FULL_PAIRS = 8  # full mode: at least this many pairs wherever a sentence states a comparison

ROUNDS = {  # notebook → the parameters that set its rounds of paired comparisons
    "02_fp16_bf16.py": ["REPEATS"],
    "03_int8_int4.py": ["REPEATS"],
    "03b_fp8_fp4.py": ["GEMM_ROUNDS"],
    "04_warmup.py": ["COMPILE_ROUNDS"],
    "05_kv_cache.py": ["ROUNDS"],
}


def _picks(name: str) -> dict[str, tuple[object, object]]:
    """Each ``NAME = config.pick(full, quick)`` of a notebook source, as (full, quick) literals."""
    out = {}
    for node in ast.parse((SRC / name).read_text(encoding="utf-8")).body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "config.pick"):
            full, quick = (ast.literal_eval(a) for a in node.value.args)
            out[node.targets[0].id] = (full, quick)
    return out


@pytest.mark.parametrize("name", sorted(ROUNDS))
def test_each_comparison_runs_enough_pairs(name):
    picks = _picks(name)
    for param in ROUNDS[name]:
        full, quick = picks[param]
        assert quick >= verdict.MIN_PAIRS, f"{name}: {param} gives {quick} pairs in quick mode"
        assert full >= FULL_PAIRS, f"{name}: {param} gives {full} pairs in full mode"


@pytest.mark.parametrize("name", ["03_int8_int4.py", "03b_fp8_fp4.py", "02_fp16_bf16.py"])
def test_quick_mode_scores_the_prompts_a_verdict_needs(name):
    full, quick = _picks(name)["REF_PROMPTS"]
    assert min(full, quick) >= verdict.MIN_SAMPLES, f"{name}: REF_PROMPTS {quick} in quick mode"


def test_the_comparisons_in_rounds_are_judged_paired():
    """Every findings module of 02–05 that judges rows timed in rounds passes ``paired=True``."""
    lessons = Path(__file__).resolve().parents[1] / "labkit" / "lessons"
    for nb in ("nb02", "nb03", "nb05"):
        text = (lessons / nb / "findings.py").read_text(encoding="utf-8")
        assert "paired=True" in text, nb
    assert "paired=paired" in (lessons / "nb04" / "findings.py").read_text(encoding="utf-8")
