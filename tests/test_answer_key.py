"""The instructor's answer key (tools/answer_key.py): ranges by CPU class and mode, and the room's verdicts."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
from tools import answer_key

from labkit.core import results  # noqa: E402


def _run(folder: Path, value: float, isa: list[str], quick: bool = True, name: str = "02_fp16_bf16") -> Path:
    res = results.Results(name, env={"hardware": {"cpu": "AMD EPYC", "cpu_isa": isa}, "quick": quick,
                                     "date": "2026-12-04T08:00:00"},
                          notes={"headline": {"label": "fp16 decode tokens/s / fp32's", "value": value}})
    folder.mkdir(parents=True, exist_ok=True)
    res.save(folder / f"{name}.json")
    return folder


def test_ranges_never_pool_classes_or_modes(tmp_path):
    runs = (answer_key.headlines(_run(tmp_path / "a", 1.9, ["avx2", "fma"]))
            + answer_key.headlines(_run(tmp_path / "b", 1.35, ["avx2", "fma"]))
            + answer_key.headlines(_run(tmp_path / "c", 0.23, ["avx2", "avx512f", "avx512_bf16"]))
            + answer_key.headlines(_run(tmp_path / "d", 1.58, ["avx2", "avx512f"], quick=False)))
    rng = answer_key.ranges(runs)
    avx2 = rng[("02_fp16_bf16", "fp16 decode tokens/s / fp32's", "AVX2", "quick")]
    assert (avx2["n"], avx2["min"], avx2["max"]) == (2, 1.35, 1.9)
    assert rng[("02_fp16_bf16", "fp16 decode tokens/s / fp32's", "AVX-512", "quick")]["n"] == 1
    assert ("02_fp16_bf16", "fp16 decode tokens/s / fp32's", "AVX-512", "full") in rng
    text = answer_key.markdown(runs)
    assert "No run recorded yet for: Apple silicon, Arm, GPU" in text and "| AVX2 | quick | 2 | 1.35 |" in text


def test_the_room_reads_expected_noise_or_broken():
    rng = {"n": 3, "min": 1.3, "median": 1.6, "max": 1.9}
    assert answer_key.judge(1.5, rng).startswith("as expected (1.3–1.9 over 3 runs)")
    assert "noise" in answer_key.judge(1.1, rng) and "noise" in answer_key.judge(3.0, rng)
    assert "more than 2× off" in answer_key.judge(0.5, rng) and "more than 2× off" in answer_key.judge(4.0, rng)
    assert "no recorded run" in answer_key.judge(1.5, None)


def test_the_shipped_key_is_the_doc_and_names_its_machines():
    runs = answer_key.load_key()
    assert runs and all(r["class"] in answer_key.CLASSES for r in runs), "every run filed under a CPU class"
    assert answer_key.DOC.read_text(encoding="utf-8") == answer_key.markdown(runs), \
        "docs/answer_key.md is stale: python -m tools.answer_key --write"


def test_files_without_a_headline_or_an_isa_are_not_filed(tmp_path):
    folder = _run(tmp_path / "r", 1.5, [])
    assert answer_key.headlines(folder)[0]["class"] == "ISA not recorded"
    results.Results("04_warmup", env={"hardware": {"cpu_isa": ["avx2"]}}).save(folder / "04_warmup.json")
    assert [h["notebook"] for h in answer_key.headlines(folder)] == ["02_fp16_bf16"]
