"""A reference file can take some sections of a later run (``python -m tools.run_notebooks --reference
--sections``), each shown with the provenance of the run it came from; a notebook that cannot measure a section
shows those rows, through the one ``references.show``."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from labkit.core import config, results
from labkit.lessons import references
from tools import run_notebooks

OLD = {"date": "2026-12-01", "hardware": {"cpu": "old CPU"}, "device": "cpu", "versions": {}, "command": "old run"}
NEW = {"date": "2026-12-03", "hardware": {"cpu": "new CPU"}, "device": "cpu", "versions": {}}


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    monkeypatch.setattr(config, "DATA_DIR", tmp_path / "data")
    monkeypatch.setenv("LABKIT_RESULTS", str(tmp_path / "results"))
    (tmp_path / "data" / "reference").mkdir(parents=True)
    old = results.Results("10_beyond", env=OLD)
    old.add("cpu_engines", engine="llama.cpp", decode_tokens_per_s=50.0)
    old.add("vllm_mechanisms", figure="stale", vllm=0.0)
    old.save(results.reference_dir() / "10_beyond.json")
    new = results.Results("10_beyond", env=dict(NEW), notes={"vllm": {"version": "0.32.0"}})
    new.add("cpu_engines", engine="PyTorch", decode_tokens_per_s=20.0)  # this machine has no llama.cpp
    new.add("vllm_mechanisms", figure="TTFT ratio", vllm=1.9)
    new.save(tmp_path / "results" / "10_beyond.json")
    return tmp_path


def test_sections_are_copied_into_the_reference_with_their_own_provenance(dirs):
    run_notebooks.save_reference("10_beyond", "python -m tools.run_notebooks --reference --only 10_beyond --sections "
                                 "vllm_mechanisms vllm", sections=["vllm_mechanisms", "vllm"])
    ref = results.reference("10_beyond")
    assert [r["engine"] for r in ref.section("cpu_engines")] == ["llama.cpp"], "the other sections stay as they were"
    assert [r["figure"] for r in ref.section("vllm_mechanisms")] == ["TTFT ratio"] and ref.notes["vllm"]["version"]
    assert ref.env["command"] == "old run" and "old CPU" in results.section_provenance(ref, "cpu_engines")
    line = results.section_provenance(ref, "vllm_mechanisms")
    assert "new CPU" in line and "2026-12-03" in line and "--sections" in line
    with pytest.raises(ValueError, match="none of the sections"):
        run_notebooks.save_reference("10_beyond", "cmd", sections=["nothing_like_it"])


def test_a_whole_run_still_replaces_the_reference(dirs):
    run_notebooks.save_reference("10_beyond", "full run")
    ref = results.reference("10_beyond")
    assert [r["engine"] for r in ref.section("cpu_engines")] == ["PyTorch"] and ref.env["command"] == "full run"


def test_a_reference_section_is_shown_with_its_provenance_and_rows(dirs, capsys):
    run_notebooks.save_reference("10_beyond", "sections run", sections=["vllm_mechanisms"])
    assert references.show("10_beyond", "vllm_mechanisms", ["figure", "vllm"]) == 1
    out = capsys.readouterr().out
    assert "new CPU" in out and "sections run" in out
    assert references.show("10_beyond", "vllm_same_load", ["server"]) == 0
    assert "No reference of it ships yet" in capsys.readouterr().out
    assert references.show("06_batching", "vllm_same_load", ["server"]) == 0, "no file at all: one line"


def test_several_sections_each_under_their_provenance_and_a_kept_subset(dirs, capsys):
    run_notebooks.save_reference("10_beyond", "sections run", sections=["vllm_mechanisms"])
    shown = references.show("10_beyond", ["cpu_engines", "vllm_mechanisms"], ["engine", "figure"],
                            keep=lambda row: row.get("engine") != "llama.cpp")
    out = capsys.readouterr().out
    assert shown == 1 and "No reference of it ships yet" in out and "sections run" in out and "llama.cpp" not in out


def test_a_source_that_is_not_one_of_the_three_names_them():
    with pytest.raises(ValueError, match=r"source='cpu'.*'reference', 'gpu', 'published'"):
        references.show("10_beyond", "vllm_mechanisms", source="cpu")


def test_core_loads_references_and_never_renders_them():
    """core loads the reference files and the published figures; ``lessons.references`` shows them: no module of
    core imports IPython's display."""
    core = Path(__file__).resolve().parent.parent / "labkit" / "core"
    rendering = sorted(p.name for p in core.rglob("*.py") for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
                       if isinstance(n, (ast.Import, ast.ImportFrom))
                       and any(m.split(".")[0] == "IPython" for m in
                               ([a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""])))
    assert len(list(core.rglob("*.py"))) > 10 and rendering == [], rendering
