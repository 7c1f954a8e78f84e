"""Notebooks 06–09 run enough rounds for a paired verdict: at least ``verdict.MIN_PAIRS`` in quick mode where that
fits the notebook's time, 8 in full mode wherever a sentence states a comparison; where quick mode cannot fit them
(07's scheduler rounds, 09's precision probe), the notebook shows the reference beside its own "no verdict (N
pairs)"."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from labkit.core import verdict

SRC = Path(__file__).resolve().parent.parent / "notebooks" / "src"
# notebook -> the knobs that set how many rounds a paired verdict gets, and whether quick mode fits six
KNOBS = {"06_batching": {"SWEEP_REPEATS": True, "SERVE_ROUNDS": True, "OPEN_LOOP_ROUNDS": True, "VLLM_ROUNDS": True},
         "07_vllm": {"ROUNDS": False},
         "08_tensorrt": {"ROUNDS": True, "FUSION_REPEATS": True},
         "09_capstone": {"PROBE_ROUNDS": False}}
SHOWN = {"07_vllm": "reference=ref", "09_capstone": 'references.show("09_capstone", "precision_choice"'}


def picks(text: str) -> dict[str, tuple[int, int]]:
    """``NAME = config.pick(full, quick)`` lines of a notebook source: name -> (full, quick)."""
    return {name: (int(full), int(quick))
            for name, full, quick in re.findall(r"^([A-Z_]+) = config\.pick\((\d+), (\d+)\)", text, re.M)}


@pytest.mark.parametrize("notebook", sorted(KNOBS))
def test_rounds_knobs_give_a_paired_verdict_its_pairs(notebook: str) -> None:
    text = (SRC / f"{notebook}.py").read_text(encoding="utf-8")
    found = picks(text)
    for name, quick_fits in KNOBS[notebook].items():
        assert name in found, f"{notebook}: {name} is no longer a config.pick knob"
        full, quick = found[name]
        assert full >= 8, f"{notebook}.{name}: full mode needs at least 8 pairs, has {full}"
        if quick_fits:
            assert quick >= verdict.MIN_PAIRS, f"{notebook}.{name}: quick mode runs {quick} < {verdict.MIN_PAIRS} pairs"
        else:
            assert SHOWN[notebook] in text, f"{notebook}: quick mode runs {quick} pairs; it must show the reference"


def test_the_knob_reader_sees_a_short_knob():
    assert picks("ROUNDS = config.pick(5, 3)  # x\n") == {"ROUNDS": (5, 3)}
