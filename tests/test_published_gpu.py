"""Published GPU figures: the shipped file validates, a bad row is refused with its fix named, and a notebook's GPU
reference cell shows published rows (labelled so) only where no measured reference ships."""
from __future__ import annotations

import copy
import json

import pytest

from labkit.core import published, results
from labkit.lessons import references

GOOD = {"id": "x", "notebooks": ["02"], "what": "FP8 vs BF16", "model": "Llama-3.1-8B", "gpu": "H200", "gpus": 1,
        "engine": "TensorRT-LLM", "engine_version": "0.15", "precision": "FP8",
        "workload": {"batch_size": 1, "input_tokens": 2048, "output_tokens": 128},
        "figures": {"tokens_per_s": 245.03}, "units": {"tokens_per_s": "tokens/s"},
        "source": "https://example.org/benchmark.md", "date": "2025-01-08", "date_meaning": "commit date",
        "where": "table 1.1"}


def test_the_shipped_file_validates_and_every_row_has_provenance():
    rows = published.load()
    assert len(rows) >= 12
    assert len({r["id"] for r in rows}) == len(rows)
    for r in rows:
        assert r["source"].startswith("https://") and r["date"] and r["date_meaning"] and r["where"]
        assert set(r["figures"]) == set(r["units"])
    # every notebook with a GPU reference cell but 04 and 10 (which have none) gets at least one published row
    for nb in ("02", "03", "05", "06", "07", "08", "09", "11"):
        assert published.for_notebook(nb, rows), nb


@pytest.mark.parametrize("change, fix", [
    ({"figures": {"tokens_per_s": -3}}, "positive number"),
    ({"figures": {"tokens_per_s": 0}}, "positive number"),
    ({"figures": {"tokens_per_s": True}}, "positive number"),
    ({"units": {}}, 'add "tokens_per_s"'),
    ({"source": "github.com/x"}, "URL of the page"),
    ({"date": "Jan 2025"}, "YYYY-MM-DD"),
    ({"date": "2025-13-01"}, "YYYY-MM-DD"),
    ({"notebooks": ["2"]}, "two-digit numbers"),
    ({"gpus": 0}, "positive integer"),
    ({"engine_version": ""}, "not stated on the page"),
    ({"workload": {"batch_size": -1}}, "positive number"),
    ({"workload": {"batch": 8}}, "choose from"),
])
def test_a_bad_row_raises_naming_the_fix(change, fix):
    row = {**copy.deepcopy(GOOD), **change}
    with pytest.raises(ValueError, match=fix) as raised:
        published.check_row(row, 3)
    assert "row 3 ('x')" in str(raised.value)


def test_a_row_without_its_source_names_the_missing_fields():
    row = {k: v for k, v in GOOD.items() if k not in ("source", "date")}
    with pytest.raises(ValueError, match=r"missing \['source', 'date'\]"):
        published.check_row(row)


def test_load_refuses_duplicate_ids_and_a_bad_row_in_a_file(tmp_path):
    path = tmp_path / "published_gpu.json"
    path.write_text(json.dumps({"rows": [GOOD, GOOD]}), encoding="utf-8")
    with pytest.raises(ValueError, match="same id twice"):
        published.load(path)
    path.write_text(json.dumps({"rows": [GOOD, {**GOOD, "id": "y", "date": "soon"}]}), encoding="utf-8")
    with pytest.raises(ValueError, match=r"row 1 \('y'\).*YYYY-MM-DD"):
        published.load(path)
    with pytest.raises(FileNotFoundError, match="ships in the repository"):
        published.load(tmp_path / "missing.json")


@pytest.fixture
def reference_dir(tmp_path, monkeypatch):
    """An empty reference directory; data/published_gpu.json stays the shipped one."""
    monkeypatch.setattr(results, "reference_dir", lambda: tmp_path)
    return tmp_path


def test_without_a_measured_reference_the_cell_shows_published_rows_labelled(reference_dir, capsys):
    assert references.show("08_tensorrt", "engines", source="gpu") == 0
    out = capsys.readouterr().out
    assert "make reference NOTEBOOKS=08" in out
    assert "Published GPU figures" in out and "NOT measured here" in out
    row = published.for_notebook("08")[0]
    assert row["source"] in out and row["date"] in out


def test_a_notebook_without_published_rows_says_so_in_one_line(reference_dir, capsys):
    references.show("04_warmup", "warmup", source="gpu")
    out = capsys.readouterr().out
    assert "No published GPU figure for notebook 04" in out and "Published GPU figures" not in out


def test_a_precision_filter_keeps_only_rows_in_that_format(capsys):
    fp8 = [r for r in published.for_notebook("03") if "fp8" in r["precision"].lower()]
    others = [r for r in published.for_notebook("03") if "fp8" not in r["precision"].lower()]
    assert fp8 and others  # the filter has something to keep and something to drop
    assert references.show("03", source="published", precision=("FP8",)) == len(fp8)
    out = capsys.readouterr().out
    assert all(r["source"] in out for r in fp8) and "Published GPU figures" in out
    assert references.show("03", source="published", precision=("FP2",)) == 0
    assert "No published GPU figure in FP2 for notebook 03" in capsys.readouterr().out


def test_a_measured_reference_is_shown_alone_without_published_rows(reference_dir, capsys):
    env = {"device": "cuda", "hardware": {"gpu": "NVIDIA L4"}, "date": "2030-01-01", "command": "make reference",
           "versions": {"torch": "2.13.0"}}
    res = results.Results("08_tensorrt", env=env)
    res.add("engines", engine="eager", decode_tokens_per_s=300.0)
    res.save(reference_dir / f"{results.reference_name('08_tensorrt', env)}.json")
    assert references.show("08_tensorrt", "engines", source="gpu") == 1
    out = capsys.readouterr().out
    assert "NVIDIA L4" in out
    assert "Published" not in out and not any(r["source"] in out for r in published.load())
