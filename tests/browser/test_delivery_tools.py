"""tools.run_notebooks, tools.summary and tools.slides without a browser: failure reporting, summary merge,
deck preparation and the offline check. Fast (two small kernels), part of `make test-unit`."""
from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

from conftest import ROOT
from tools import run_notebooks, summary
from tools.slides import build, layout, prepare, rules, tables


def _notebook(path: Path, cells: list[str], slide_types: list[str] | None = None) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]
    for cell, kind in zip(nb.cells, slide_types or []):
        cell.metadata["slideshow"] = {"slide_type": kind}
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}}
    nbformat.write(nb, path)
    return path


@pytest.fixture
def two_notebooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    monkeypatch.setenv("LABKIT_RESULTS", str(tmp_path / "results"))
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    _notebook(nbs / "10_fails.ipynb", ["x = 1", "y = x + 1\nraise ValueError('boom at ' + str(y))", "print('never')"])
    _notebook(nbs / "11_ok.ipynb", [
        "from labkit.core import results\nres = results.Results('11_ok')",
        "res.add('speed', batch=4, tokens_per_s=123.456789)\nres.save()",
        "from labkit.core import verdict\nv = verdict.compare([2.0, 2.1, 2.2], [1.0, 1.1, 1.2])",
    ])
    return nbs, tmp_path / "build"


def test_failing_notebook_reported_with_its_cell_and_the_next_still_runs(two_notebooks) -> None:
    nbs, build = two_notebooks
    code = run_notebooks.main(["--notebooks-dir", str(nbs), "--build-dir", str(build), "--timeout", "120"])
    assert code == 1
    summary = json.loads((build / "summary.json").read_text(encoding="utf-8"))
    by_name = {n["name"]: n for n in summary["notebooks"]}
    failed, ok = by_name["10_fails"], by_name["11_ok"]
    assert failed["status"] == "failed"
    assert failed["failed_cell"]["index"] == 1
    assert failed["failed_cell"]["error"] == "ValueError: boom at 2"
    assert "raise ValueError" in failed["failed_cell"]["source_excerpt"]
    assert ok["status"] == "ok" and ok["wall_s"] > 0
    rows = ok["results"][0]["sections"][0]
    assert (rows["section"], rows["rows"][0]["batch"], rows["rows"][0]["tokens_per_s"]) == ("speed", 4, 123.5)
    assert summary["n_failed"] == 1 and summary["n_notebooks"] == 2
    executed = nbformat.read(build / "executed" / "10_fails.ipynb", as_version=4)
    assert executed.cells[1].outputs[0]["ename"] == "ValueError"
    logged = [json.loads(line) for line in (build / "verdicts" / "11_ok.jsonl").read_text().splitlines()]
    assert [(v["kind"], round(v["ratio"], 2)) for v in logged] == [("better", 1.91)]  # each notebook, its own log
    assert not (build / "verdicts" / "10_fails.jsonl").exists()  # it failed before any verdict
    page = (build / "summary.html").read_text(encoding="utf-8")
    assert "failing cell 1" in page and "boom at 2" in page and "results/11_ok.json" in page


def test_missing_kernel_is_a_reported_failure(tmp_path: Path) -> None:
    path = _notebook(tmp_path / "12_kernel.ipynb", ["1"])
    nb = nbformat.read(path, as_version=4)
    nb.metadata["kernelspec"]["name"] = "no-such-kernel"
    nbformat.write(nb, path)
    run = run_notebooks.run_notebook(path, tmp_path / "executed", timeout_s=60)
    assert run.status == "kernel error" and run.failed_cell.index == -1
    assert "no-such-kernel" in run.failed_cell.error and "python3" in run.failed_cell.error


def _run(name: str, path: Path, status: str = "ok") -> summary.NotebookRun:
    return summary.NotebookRun(name=name, path=str(path), executed_path=str(path), status=status, wall_s=1.5,
                                     quick=True, finished_at=f"{name}-time", n_cells=1, n_code_cells=1)


def test_partial_run_keeps_earlier_entries(tmp_path: Path) -> None:
    a, b = _notebook(tmp_path / "00_a.ipynb", ["1"]), _notebook(tmp_path / "01_b.ipynb", ["1"])
    gone = tmp_path / "02_gone.ipynb"
    summary.write_summary([_run("01_b", b, "failed"), _run("02_gone", gone)], 3.0, tmp_path)
    merged = summary.write_summary([_run("00_a", a)], 1.5, tmp_path)
    assert [n["name"] for n in merged["notebooks"]] == ["00_a", "01_b"], "kept 01_b, dropped a deleted notebook"
    assert merged["notebooks"][1]["finished_at"] == "01_b-time"
    assert (merged["n_failed"], merged["total_wall_s"], merged["run_wall_s"]) == (1, 3.0, 1.5)


def test_unknown_notebook_name_lists_the_choices(tmp_path: Path) -> None:
    _notebook(tmp_path / "00_a.ipynb", ["1"])
    with pytest.raises(ValueError, match="available: \\['00_a'\\]"):
        run_notebooks.discover(["07"], tmp_path)


def test_prepare_drops_solutions_and_turns_widgets_into_a_note() -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    panel = nbformat.v4.new_code_cell("panel()", outputs=[nbformat.v4.new_output(
        "display_data", data={rules.WIDGET_VIEW: {"model_id": "a"}, "text/plain": "VBox(children=(IntSlider(),))"})])
    bar = nbformat.v4.new_code_cell("loop()", outputs=[nbformat.v4.new_output(
        "display_data", data={rules.WIDGET_VIEW: {"model_id": "b"}, "text/plain": "100%|██████████| 5/5 [00:01]"})])
    solution = nbformat.v4.new_code_cell("answer = 42", metadata={"tags": ["solution"]})
    nb.cells = [panel, bar, solution]
    out = prepare.prepare(nb)
    assert len(out.cells) == 2 and "widgets" not in out.metadata
    assert out.cells[0].outputs[0]["data"]["text/html"] == rules.WIDGET_NOTE
    assert out.cells[1].outputs[0]["data"] == {"text/plain": "100%|██████████| 5/5 [00:01]"}
    assert len(nb.cells) == 3 and rules.WIDGET_VIEW in nb.cells[0].outputs[0]["data"], "the input is left alone"


def test_remote_references_are_found_and_plotly_mathjax_removed() -> None:
    page = ('<a href="https://example.org/docs">a link is fine</a>'
            '<script src="https://cdn.example.org/x.js"></script>'
            '<link rel="stylesheet" href="//fonts.example.org/f.css">'
            "<script type='module'>import m from 'https://esm.example.org/m.mjs';</script>"
            '<style>@import url("https://css.example.org/a.css");</style>'
            '<script src="reveal.js/dist/reveal.js"></script>')
    assert build.remote_references(page) == ["//fonts.example.org/f.css", "https://cdn.example.org/x.js",
                                              "https://css.example.org/a.css", "https://esm.example.org/m.mjs"]
    mj = '<div><script src="https://cdnjs.cloudflare.com/ajax/libs/mathjax/3.2.2/es5/tex-svg.min.js"></script></div>'
    assert build.remote_references(build.make_offline(mj)) == []


def test_expected_slides_follows_nbconvert() -> None:
    nb = nbformat.v4.new_notebook()
    kinds = ["skip", "-", "fragment", "subslide", "slide", "notes", "-", "slide"]
    nb.cells = [nbformat.v4.new_markdown_cell(k, metadata={"slideshow": {"slide_type": k}}) for k in kinds]
    assert layout.expected_slides(nb) == 4  # first shown cell, subslide, slide, slide


def test_deck_from_a_notebook_with_a_plot_fetches_nothing(tmp_path: Path) -> None:
    import plotly.graph_objects as go
    import plotly.io as pio

    bundle = pio.renderers["notebook"].to_mimebundle(go.Figure(go.Bar(x=["a", "b"], y=[1, 2])).to_dict())
    assert "cdnjs" in bundle["text/html"], "plotly's figure HTML no longer asks for a CDN: simplify make_offline"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# A deck\n\n$x^2$", metadata={"slideshow": {"slide_type": "slide"}}),
                nbformat.v4.new_code_cell("fig.show()", metadata={"slideshow": {"slide_type": "subslide"}},
                                          outputs=[nbformat.v4.new_output("display_data", data=bundle)])]
    executed = tmp_path / "99_plot.ipynb"
    nbformat.write(nb, executed)
    deck, n = build.export_deck(executed, tmp_path)
    text = deck.read_text(encoding="utf-8")
    assert n == 2 and "plotly-graph-div" in text
    assert 'src="reveal.js/dist/reveal.js"' in text and "static/mathjax/tex-svg-full.js" in text
    assert build.remote_references(text) == []


def test_class_results_pack_and_merge(tmp_path: Path) -> None:
    import csv

    from tools import merge_results
    from labkit.core import results

    for learner, tps, machine in (("alice", [10.0, 12.0, 14.0], "cpu A"), ("bob", [30.0], "GPU B")):
        res = results.Results("00_setup", env={"hardware": {"cpu": machine}, "device": "cpu", "quick": True})
        for v in tps:
            res.add("chat", decode_tokens_per_s=v, answer="Paris")
        res.save(tmp_path / learner / "results" / "00_setup.json")
        merge_results.pack(learner, tmp_path / learner / "results", tmp_path / "inbox")
    (tmp_path / "inbox" / "carol").mkdir()
    (tmp_path / "inbox" / "carol" / "notes.json").write_text('{"not": "a results file"}', encoding="utf-8")
    info = merge_results.merge([tmp_path / "inbox"], tmp_path / "class")
    assert info["learners"] == ["alice", "bob"] and info["rows"] == 4
    assert len(info["skipped"]) == 1 and "carol: notes.json" in info["skipped"][0]
    with open(tmp_path / "class" / "rows.csv", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert {(r["learner"], r["machine"]) for r in rows} == {("alice", "cpu A (ISA not recorded)"),
                                                            ("bob", "GPU B (ISA not recorded)")}
    page = (tmp_path / "class" / "index.html").read_text(encoding="utf-8")
    assert "<td>alice</td><td>cpu A (ISA not recorded)</td><td>cpu</td><td>quick</td><td>3</td><td>12</td>" in page
    with pytest.raises(ValueError, match="use letters"):
        merge_results.pack("a b", tmp_path, tmp_path)


def test_class_merge_skips_each_bad_file_with_its_reason(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import zipfile

    from tools import merge_results
    from labkit.core import results

    inbox = tmp_path / "inbox"
    good = results.Results("00_setup", env={"hardware": {"cpu": "c"}, "device": "cpu", "quick": True})
    good.add("chat", decode_tokens_per_s=11.0)
    good.save(tmp_path / "alice" / "results" / "00_setup.json")
    merge_results.pack("alice", tmp_path / "alice" / "results", inbox)
    (inbox / "labkit-results-bob.zip").write_bytes(b"this is not a zip")
    with zipfile.ZipFile(inbox / "labkit-results-carol.zip", "w") as zf:
        zf.writestr("results/00_setup.json", json.dumps({"name": "00_setup", "rows": {"not": "a list"}}))
        zf.writestr("results/01_sizing.json", b"\xff\xfe not utf-8")
    code = merge_results.main(["merge", str(inbox), "--out", str(tmp_path / "class")])
    out = capsys.readouterr().out
    assert code == 0 and "1 learners, 1 files" in out and "3 file(s) skipped, the rest merged" in out
    assert "skipped: bob: labkit-results-bob.zip: not a readable zip file" in out
    assert "skipped: carol: 00_setup.json: not a labkit results file: 'rows' must be a list" in out
    assert "skipped: carol: 01_sizing.json: not UTF-8 text" in out


def test_reference_copies_results_with_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from labkit.core import results

    monkeypatch.setenv("LABKIT_RESULTS", str(tmp_path / "results"))
    res = results.Results("07_demo", env={"command": "ipykernel_launcher -f kernel.json", "quick": False})
    res.add("batching", mode="continuous", tokens_per_s=12.5)
    res.save()
    out = run_notebooks.save_reference("07_demo", "python -m tools.run_notebooks --reference --only 07_demo",
                                       tmp_path / "reference")
    saved = results.load(out)
    assert out == tmp_path / "reference" / "07_demo.json"
    assert saved.env["command"] == "python -m tools.run_notebooks --reference --only 07_demo"
    assert [r["tokens_per_s"] for r in saved.section("batching")] == [12.5]
    with pytest.raises(FileNotFoundError, match="run its notebook first"):
        run_notebooks.save_reference("08_never_ran", "x", tmp_path / "reference")
    monkeypatch.setenv("LABKIT_QUICK", "1")
    with pytest.raises(SystemExit) as exc:
        run_notebooks.main(["--reference", "--only", "07"])
    assert exc.value.code == 2


_REGISTER = ("from labkit.lessons import exercises\n"
             "def _check(answer):\n"
             "    if answer != 42:\n"
             "        raise exercises.Wrong(f'{answer} is not the answer')\n"
             "exercises.exercise('99.answer', 'the answer')(_check)")


def _exercise_notebook(path: Path, placeholder: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(_REGISTER),
                nbformat.v4.new_code_cell(placeholder, metadata={"labkit": {"exercise": "99.answer"}, "tags": ["exercise"]}),
                nbformat.v4.new_code_cell('exercises.check("99.answer", answer)')]
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}}
    nbformat.write(nb, path)
    return path


def test_exercise_checks_as_shipped_and_with_solutions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = _exercise_notebook(tmp_path / "99_ok.ipynb", "answer = None")
    run = run_notebooks.run_notebook(shipped, tmp_path / "executed", timeout_s=60)
    assert run.status == "ok" and run.exercises == {"99.answer": "not attempted"}

    spoiled = _exercise_notebook(tmp_path / "99_spoiled.ipynb", "answer = 42")
    run = run_notebooks.run_notebook(spoiled, tmp_path / "executed", timeout_s=60)
    assert run.status == "exercise check failed" and "99.answer: correct" in run.failed_cell.error

    solutions = tmp_path / "solutions"
    solutions.mkdir()
    monkeypatch.setattr(run_notebooks, "SOLUTIONS_DIR", solutions)
    (solutions / "99_ok.py").write_text("# %% exercise 99.answer\nanswer = 41\n", encoding="utf-8")
    run = run_notebooks.run_notebook(shipped, tmp_path / "executed", timeout_s=60, solutions=True)
    assert run.status == "exercise check failed" and "wrong" in run.failed_cell.error
    (solutions / "99_ok.py").write_text("# %% exercise 99.answer\nanswer = 6 * 7\n", encoding="utf-8")
    run = run_notebooks.run_notebook(shipped, tmp_path / "executed", timeout_s=60, solutions=True)
    assert run.status == "ok" and run.exercises == {"99.answer": "correct"}


# ------------------------------------------------------------------ quiet kernels, the summary's short table

TCP_WARNING = "without encryption"


def test_kernels_start_without_the_plain_tcp_warning(tmp_path: Path, capfd: pytest.CaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_client.manager import AsyncKernelManager

    nb = _notebook(tmp_path / "13_quiet.ipynb", ["print(6 * 7)"])
    log = tmp_path / "executed" / "13_quiet.kernel.log"  # the kernel process's own stderr

    def said() -> str:  # what the kernel process wrote, wherever it went
        return capfd.readouterr().err + (log.read_text(errors="replace") if log.is_file() else "")

    run = run_notebooks.run_notebook(nb, tmp_path / "executed", timeout_s=60)
    assert run.status == "ok"
    assert log.is_file(), "the kernel's stderr goes to a log beside the executed notebook"
    assert TCP_WARNING not in said(), "CurveZMQ (or IPC) kernels do not warn"

    monkeypatch.setattr(run_notebooks.QuietKernelManager, "_curve", lambda self: False)  # no CurveZMQ: IPC
    assert run_notebooks.run_notebook(nb, tmp_path / "executed", timeout_s=60).status == "ok"
    assert TCP_WARNING not in said()

    # the test can fail: with a plain kernel manager (plain TCP) an ipykernel that has the warning warns
    import inspect

    import ipykernel.kernelapp

    monkeypatch.setattr(run_notebooks, "QuietKernelManager", AsyncKernelManager)
    assert run_notebooks.run_notebook(nb, tmp_path / "executed", timeout_s=60).status == "ok"
    if TCP_WARNING in inspect.getsource(ipykernel.kernelapp):
        assert TCP_WARNING in said()


def test_the_kernels_own_stderr_goes_to_its_log(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """A library writing to the kernel's fd 2 (the profiler's USDT lines) fills a log, not `make run`'s terminal;
    what a cell prints to sys.stderr stays in the notebook."""
    nb = _notebook(tmp_path / "14_stderr.ipynb", ["import os, sys\nos.write(2, b'native line from fd 2\\n')\n"
                                                  "print('cell stderr', file=sys.stderr)"])
    run = run_notebooks.run_notebook(nb, tmp_path / "executed", timeout_s=60)
    assert run.status == "ok"
    assert "native line from fd 2" not in capfd.readouterr().err
    assert "native line from fd 2" in (tmp_path / "executed" / "14_stderr.kernel.log").read_text()
    executed = nbformat.read(tmp_path / "executed" / "14_stderr.ipynb", as_version=4)
    assert any("cell stderr" in o.get("text", "") for o in executed.cells[0].outputs)


def test_headline_is_what_the_notebook_recorded_never_a_guess() -> None:
    from labkit.core import results
    from labkit.lessons import findings

    res = results.Results("05_demo")
    res.add("kv_bytes", layers=30, ratio=1.0, speedup=9.0)  # result-like columns: never read as a headline
    assert summary.headline(res) is None, "no headline recorded: none shown"
    findings.record(res, findings.Findings(rows=[{"finding": "text only", "value": None},
                                                 {"finding": "cache on vs off (speedup ×)", "value": 3.2,
                                                  "verdict": "better"}], sentences=[]))
    assert summary.headline(res) == {"label": "cache on vs off (speedup ×)", "value": 3.2, "verdict": "better"}
    assert res.section("summary")[1]["value"] == 3.2
    reloaded = results.Results.from_dict(res.to_dict())  # what the runner reads back from results/<name>.json
    assert summary.headline(reloaded)["value"] == 3.2
    with pytest.raises(ValueError, match="no finding holds a number"):
        findings.record(res, findings.Findings(rows=[{"finding": "text", "value": None}], sentences=[]))


def test_summary_page_opens_with_the_short_table(two_notebooks) -> None:
    nbs, build = two_notebooks
    _notebook(nbs / "12_sum.ipynb", [
        "from labkit.core import results\nres = results.Results('12_sum')\nres.add('sweep', batch=8, tokens_per_s=40.0)",
        "from labkit.lessons import findings\nfindings.record(res, findings.Findings(rows=[{'finding': 'batch 8 vs 1 "
        "(throughput ×)', 'value': 5.4321, 'verdict': 'better'}], sentences=[]))\nres.save()"])
    run_notebooks.main(["--notebooks-dir", str(nbs), "--build-dir", str(build), "--timeout", "120", "--only", "11", "12"])
    page = (build / "summary.html").read_text(encoding="utf-8")
    short = page.index("<table class='short'>")
    assert short < page.index("<h2>Runs</h2>") < page.index("<h2 id='11_ok'>")
    assert page[:short].count("<table") == 0, "nothing tabular before the short table"
    rows = page[short:page.index("</table>", short)].split("<tr>")[2:]
    assert [r[r.index("#") + 1:r.index("'>")] for r in rows] == ["11_ok", "12_sum"]
    unrecorded, summary = rows
    assert "<td class='ok'>ok</td>" in summary and ">5.432<" in summary and "batch 8 vs 1 (throughput ×)" in summary
    assert "(better)" in summary, "the headline's verdict beside it"
    assert "no number saved" in unrecorded and "123.5" not in unrecorded, "a column is never guessed as the headline"


# ------------------------------------------------------------------------------------ the class page's plots


def _learner_results(root: Path, learner: str, scale: float, notebooks: tuple[str, ...]) -> Path:
    """Results files shaped like the notebooks' own (same sections and columns), numbers scaled."""
    from labkit.core import results

    env = {"hardware": {"cpu": f"cpu of {learner}"}, "device": "cpu", "quick": True, "model": "default"}
    folder = root / learner / "results"
    if "01_hardware_sizing" in notebooks:
        res = results.Results("01_hardware_sizing", env=env)
        res.add("bandwidth", device="cpu", bandwidth_gbs=10.0 * scale, median_gbs=9.5 * scale)
        for b in (1, 4):
            res.add("decode", batch=b, ceiling_tokens_per_s=20.0 * scale * b, measured_tokens_per_s=8.0 * scale * b,
                    ratio=0.4)
        res.save(folder / "01_hardware_sizing.json")
    if "02_fp16_bf16" in notebooks:
        res = results.Results("02_fp16_bf16", env=env)
        for v, tps, agree in (("fp32", 10.0, 1.0), ("fp16", 18.0 * scale, 0.97), ("bf16", 5.0, 0.9)):
            res.add("variants", variant=v, status="ok", decode_tokens_per_s=tps, agreement=agree, kl=0.01)
        res.add("variants", variant="fp8", status="unsupported here: no fp8 kernels")
        res.save(folder / "02_fp16_bf16.json")
    if "06_batching" in notebooks:
        res = results.Results("06_batching", env=env)
        for b, tps in ((1, 2.0), (4, 6.0 * scale), (16, 20.0 * scale)):
            res.add("static", batch_size=b, status="ok", total_tokens_per_s=tps)
        for b, tps in ((1, 15.0), (8, 40.0 * scale)):
            res.add("serving", max_batch_size=b, output_tokens_per_s=tps)
        res.save(folder / "06_batching.json")
    return folder


def test_class_page_plots_read_the_notebooks_sections(tmp_path: Path) -> None:
    from tools import merge_results

    everything = ("01_hardware_sizing", "02_fp16_bf16", "06_batching")
    sources = [_learner_results(tmp_path, "alice", 1.0, everything), _learner_results(tmp_path, "bob", 2.0, everything)]
    subs, skipped = merge_results.collect(sources)
    assert not skipped
    roof = {p["learner"]: p for p in merge_results.roofline_points(subs)}
    assert roof["bob"]["bandwidth_gbs"] == 20.0 and roof["bob"]["tokens_per_s"] == 16.0 and roof["bob"]["batch"] == 1
    assert roof["alice"]["bytes_per_token"] == pytest.approx(10e9 / 20.0)
    prec = {(p["learner"], p["variant"]): p for p in merge_results.precision_points(subs)}
    assert set(prec) == {(l, v) for l in ("alice", "bob") for v in ("fp16", "bf16")}, "fp32 is the baseline, fp8 did not run"
    assert prec[("bob", "fp16")]["speedup"] == pytest.approx(3.6) and prec[("alice", "bf16")]["agreement"] == 0.9
    gain = {p["learner"]: p for p in merge_results.batching_points(subs)}
    assert gain["alice"]["static_gain"] == pytest.approx(10.0) and gain["alice"]["static_size"] == 16
    assert gain["bob"]["serving_gain"] == pytest.approx(80 / 15)

    page, drawn = merge_results.plots_html(subs)
    assert drawn == {"roofline": 2, "precision": 4, "batching": 2}
    assert page.count("plotly-graph-div") == 3
    roofline = merge_results.roofline_figure(merge_results.roofline_points(subs)).data[0]
    assert roofline.name == "roofline default: bandwidth ÷ 500 MB per token"
    assert roofline.y[1] / roofline.x[1] == pytest.approx(1e9 / 500e6), "tokens/s = GB/s × 1e9 ÷ bytes per token"


def test_class_page_says_which_plot_no_learner_has_data_for(tmp_path: Path) -> None:
    from tools import merge_results

    folder = _learner_results(tmp_path, "carol", 1.0, ("06_batching",))
    info = merge_results.merge([folder], tmp_path / "class")
    page = (tmp_path / "class" / "index.html").read_text(encoding="utf-8")
    assert info["learners"] == ["carol"] and page.count("plotly-graph-div") == 1
    assert "No learner's results have this yet: it needs 01_hardware_sizing" in page
    assert "No learner's results have this yet: it needs 02_fp16_bf16 or 03_int8_int4" in page
    assert build.remote_references(page) == [], "plotly.js is embedded, nothing comes from a CDN"
    assert page.index("id='batching'") < page.index("id='tables'"), "plots first, then the tables"


# ------------------------------------------------------------------------------- what a deck shows, and how


def _md(text: str, kind: str = "-") -> nbformat.NotebookNode:
    return nbformat.v4.new_markdown_cell(text, metadata={"slideshow": {"slide_type": kind}})


def _code(src: str, kind: str = "-", outputs: list | None = None, tags: list[str] | None = None,
          **meta) -> nbformat.NotebookNode:
    md = {"slideshow": {"slide_type": kind}, **meta}
    if tags:
        md["tags"] = tags
    return nbformat.v4.new_code_cell(src, metadata=md, outputs=outputs or [])


def _out(text: str, name: str = "stdout") -> nbformat.NotebookNode:
    return nbformat.v4.new_output("stream", name=name, text=text)


def _html(text: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_output("display_data", data={"text/html": text, "text/plain": "…"})


def _deck(cells: list) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = cells
    return prepare.prepare(nb)


def _shown_source(cell) -> bool:
    return not cell.metadata.get("transient", {}).get("remove_source", False)


def test_code_shows_outputs_only_unless_it_is_the_mechanism() -> None:
    deck = _deck([_md("# Title", "slide"),
                  _code("plot()", "fragment", [_out("42 tokens/s\n")]),
                  _code("def decode_step(x):\n    return x", "fragment", [_out("same tokens: True\n")], tags=["mechanism"])])
    plot, mech = deck.cells[1], deck.cells[2]
    assert not _shown_source(plot) and plot.outputs[0]["text"] == "42 tokens/s\n"
    assert _shown_source(mech) and "decode_step" in mech.source


def test_exercises_checks_solutions_and_silent_set_up_stay_in_the_notebook() -> None:
    deck = _deck([_md("# Title", "slide"),
                  _code("import labkit", "slide"),  # set-up: prints nothing, starts a slide
                  _code("N = 8  # parameters", "subslide", tags=["parameters"]),
                  _code("print('loaded')", "fragment", [_out("model loaded in 1.2 s\n")]),
                  _code("def f(): return None", "skip", tags=["exercise"], labkit={"exercise": "03.f"}),
                  _code("check('03.f', f)", "fragment", [_out("Exercise 03.f: not attempted\n")], tags=["check"]),
                  _code("answer = 42", tags=["solution"]),
                  _md("Say this out loud, do not show it.", "notes")])
    assert [c.cell_type for c in deck.cells] == ["markdown", "code", "markdown"]
    loaded = deck.cells[1]
    assert "model loaded" in loaded.outputs[0]["text"]
    assert rules._slide_type(loaded) == "slide", "the slide that began on a silent cell begins on the next one shown"
    assert rules._slide_type(deck.cells[2]) == "notes"
    assert layout.expected_slides(deck) == 2


def test_stderr_is_dropped_and_long_printed_text_is_trimmed_with_a_note() -> None:
    lines = "".join(f"step {i}: ok\n" for i in range(40))
    deck = _deck([_md("# T", "slide"), _code("run()", "fragment", [_out("warming up\n", "stderr"), _out(lines[:20]),
                                                                    _out(lines[20:])])])
    (out,) = deck.cells[1].outputs
    kept = out["text"].splitlines()
    assert len(kept) == rules.TEXT_MAX_LINES + 1 and kept[0] == "step 0: ok"
    assert kept[-1] == f"… {40 - rules.TEXT_MAX_LINES} more lines in the notebook"


def test_progress_bars_keep_only_a_finished_count() -> None:
    def bar(text: str):
        return nbformat.v4.new_output("display_data", data={rules.WIDGET_VIEW: {"model_id": "p"}, "text/plain": text})

    deck = _deck([_md("# T", "slide"), _code("a()", "-", [bar("batch sizes:   0%|          | 0/5 [00:00<?, ?it/s]"),
                                                          _out("done\n")])])
    assert [o["output_type"] for o in deck.cells[1].outputs] == ["stream"], "a bar stuck at 0/5 says nothing"


def _frame_html(n_rows: int, columns: dict) -> str:
    import pandas as pd

    return pd.DataFrame({k: (v if isinstance(v, list) else [v] * n_rows) for k, v in columns.items()}).to_html()


def test_tables_keep_the_columns_that_fit_and_say_what_was_cut() -> None:
    cols = {"variant": [f"v{i}" for i in range(20)], "device": "cpu"}
    cols.update({f"measurement_number_{k}_tokens_per_s": [float((i + 1) * (k + 1)) + 0.123456 for i in range(20)]
                 for k in range(12)})
    t = tables.trim_table(_frame_html(20, cols))
    assert t is not None and t.html.count("<tr>") == 1 + rules.TABLE_MAX_ROWS
    head = t.html[:t.html.index("</thead>")].replace("<wbr>", "")
    assert "variant" in head and "device" not in head, "a column with one value in every row becomes a note"
    assert "in every row: device = cpu" in t.cut and f"{20 - rules.TABLE_MAX_ROWS} more rows" in t.cut
    kept = head.count("measurement number ")
    assert 0 < kept < 12 and f"{12 - kept} more columns" in t.cut and "measurement number 11 tokens/s" in t.cut


def test_a_text_column_squeezed_by_the_others_is_counted_at_the_lines_it_wraps_to() -> None:
    """A browser's automatic table layout gives the numbers their line and squeezes the one text column, which
    wraps (03's "doubts" column took three lines a row in the deck): the height estimate counts those lines, so
    the packer moves what follows to a continuation slide instead of into the slide's margin."""
    numbers = {f"peak memory {k} (MiB)": [1234.5 + i for i in range(3)] for k in range(7)}
    doubts = [f"spread {n}% (over 25%: a rough median)" for n in (34, 38, 44)]  # one line where nothing squeezes it
    wide = tables.trim_table(_frame_html(3, {"variant": ["a", "b", "c"], **numbers, "doubts": doubts}))
    short = tables.trim_table(_frame_html(3, {"variant": ["a", "b", "c"], **numbers, "doubts": ["ok", "fine", "good"]}))
    assert "doubts" in wide.html and wide.cut == short.cut == ""
    assert wide.height_px >= short.height_px + 3 * rules.TABLE_ROW_PX, (wide.height_px, short.height_px)
    grid = tables.tidy_table(tables.read_table(_frame_html(2, {"date": ["2025-01-08", "2026-12-06"]})))
    (date,) = [c for c in range(len(grid.cells[0])) if "date" in tables._plain(grid.cells[0][c][2])]
    squeezed = tables._allotted(grid, [date], list(range(grid.head, len(grid.cells))), 10)
    assert squeezed[date] < 10 * rules.TABLE_CHAR_PX  # a date may break after its hyphens, as a browser breaks it


def test_a_table_that_fits_keeps_all_its_columns() -> None:
    t = tables.trim_table(_frame_html(4, {"gpu": ["T4", "L4", "A10G", "H200"], "fits fp16": [False, True, True, True],
                                          "fits nf4": True}))
    assert t.cut == "" and "fits nf4" in t.html, "a constant column is folded only when the table is too wide"


def test_tables_with_spans_are_read_as_a_grid() -> None:
    import pandas as pd

    df = pd.DataFrame({"model": ["a", "a", "b", "b"], "dtype": ["fp16", "nf4"] * 2, "T4": [True, True, False, True],
                       "L4": [True] * 4}).pivot_table(index=["model", "dtype"], values=["T4", "L4"], aggfunc="first")
    grid = tables.read_table(df.to_html())
    assert grid.index_cols == 2 and len(grid.cells[0]) == 4 and all(len(r) == 4 for r in grid.cells)
    t = tables.trim_table(df.to_html(), max_rows=3)
    assert t.html.count("<tr>") == grid.head + 3 and "1 more rows" in t.cut


def _slides_of(deck) -> list[list]:
    out = []
    for c in deck.cells:
        if rules._slide_type(c) in ("slide", "subslide") or not out:
            out.append([])
        if rules._slide_type(c) != "notes":
            out[-1].append(c)
    return out


def test_a_slide_that_would_run_past_the_bottom_continues_on_a_new_slide() -> None:
    chart = _html("<div class='plotly-graph-div'></div>")
    deck = _deck([_md("## 1 · Weights per precision\n\n" + "A sentence about weights. " * 30, "slide"),
                  _code("bar()", "fragment", [chart, _out("fp16 halves the bytes\n")]),
                  _code("two()", "subslide", [chart, chart])])
    pages = _slides_of(deck)
    assert [sum(map(layout.charts, p)) for p in pages] == [1, 0, 1, 1], "the chart stays with its idea; one per slide"
    assert "1 · Weights per precision (continued)" in pages[1][0].source
    assert "fp16 halves the bytes" in pages[1][1].outputs[0]["text"], "what did not fit continues, nothing is lost"
    assert max(sum(layout.cell_px(c) + rules.BLOCK_GAP_PX for c in p) for p in pages) <= rules.BUDGET_PX + \
        rules.BLOCK_GAP_PX
    assert layout.expected_slides(deck) == len(pages) == 4


def test_markdown_taller_than_a_slide_is_split_between_paragraphs() -> None:
    para = "\n".join(f"- point {i}: " + "words " * 30 for i in range(6))
    deck = _deck([_md(f"## Takeaways\n\n{para}\n\n## Exercises\n\n{para}", "slide")])
    assert len(deck.cells) >= 3 and all(layout.markdown_px(c.source) <= rules.BUDGET_PX for c in deck.cells)
    text = "\n".join(c.source for c in deck.cells if rules.CONT_CLASS not in c.source)
    assert text.count("- point") == 12 and "## Exercises" in text, "nothing lost in the split"


def test_exported_deck_has_the_slides_prepare_counts(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    chart = _html("<div class='plotly-graph-div'></div>")
    nb.cells = [_md("# Deck", "slide"), _code("import x", "slide"), _code("c()", "fragment", [chart, chart, chart]),
                _md("notes here", "notes")]
    executed = tmp_path / "97_count.ipynb"
    nbformat.write(nb, executed)
    deck, n = build.export_deck(executed, tmp_path)
    text = deck.read_text(encoding="utf-8")
    leaves = len(re.findall(r"<section\b", text)) - len(re.findall(r"<section\b[^>]*>\s*<section\b", text))
    assert n == leaves == 4, "the title, then one slide per chart"
    assert "import x" not in text, "set-up code stays in the notebook"
    assert "<aside class=\"notes\">" in text and "notes here" in text


def test_title_slides_hold_at_most_sixty_words() -> None:
    """The title slide says what the notebook is and why it matters; the detail is in the notes after it."""
    too_long = {}
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")):
        deck = prepare.prepare(nbformat.read(path, as_version=4))
        first = next(i for i, c in enumerate(deck.cells) if rules._slide_type(c) != "notes")
        shown = [c for c in deck.cells[first:first + 1]]
        for c in deck.cells[first + 1:]:
            if rules._slide_type(c) in ("slide", "subslide"):
                break
            if rules._slide_type(c) != "notes":
                shown.append(c)
        text = " ".join(c.source for c in shown if c.cell_type == "markdown")
        words = len([w for w in text.split() if re.search(r"\w", w)])
        if words > rules.TITLE_MAX_WORDS:
            too_long[path.name] = words
    assert not too_long, f"title slides over {rules.TITLE_MAX_WORDS} words (move detail to a notes cell): {too_long}"


def test_printed_takeaways_become_short_bullets_and_the_notes_hold_them_whole() -> None:
    long = ["- fp16: weights 0.50× fp32's bytes; decode 1.35× fp32's speed (faster), TTFT 2.65× fp32's (longer); "
            + "agreement 100% of greedy tokens, KL 2.5e-05 nats against fp32 on every reference prompt " * 3,
            "- bf16 stayed within noise of fp32 on this machine."]
    deck = _deck([_md("## Takeaways", "slide"),
                  _code("findings.show(found)", "-", [_out("saved results/02.json\n" + "\n".join(long) + "\n")])])
    (out,) = deck.cells[1].outputs
    page = out["data"]["text/html"]
    items = re.findall(r"<li>(.*?)</li>", page)
    assert len(items) == 2 and items[1] == "bf16 stayed within noise of fp32 on this machine."
    assert all(len(i) <= rules.BULLET_MAX_CHARS for i in items) and items[0].startswith("fp16: weights 0.50×")
    assert "<pre>saved results/02.json</pre>" in page, "a short printed line stays printed"
    assert not any(len(line) > rules.CONTENT_W / rules.CODE_CHAR_PX for block in re.findall(r"<pre>(.*?)</pre>", page)
                   for line in block.split("\n")), "no long line in monospace"
    notes = deck.cells[2]
    assert rules._slide_type(notes) == "notes" and long[0][2:] in notes.source, "the whole sentence is in the notes"
    assert layout.output_px(out) <= rules.BUDGET_PX


# the review's cuts: each lost what qualified its number
QUALIFIED = [
    ("bf16: weights 0.50× fp32's bytes; decode 8.20× fp32's speed (implausible — rerun (8.20× beats its bound 2.00×; "
     "load 3.1 per core)); TTFT 0.90× fp32's (shorter); the decode-like matmul took 0.21× fp32's time, the prefill-like "
     "one 0.30×. Quality: agreement 0.972, KL 0.0013 nats against fp32.", "implausible"),
    ("On NVIDIA H200 (a probe run on 2026-12-04, not this run; 1 sample a cell, so no verdict on any of them), FP8 "
     "_scaled_mm against bf16: compute-bound 4096×4096×4096 1.67×, 8192×8192×8192 1.64×; memory-bound 16×8192×28672 "
     "1.18×; fixed cost 1×4096×4096 0.70×.", "not this run"),
    ("Cost: $0.26 per million output tokens at AWS m7g.large's price (Arm), priced as if the instance made 87.1 "
     "tokens/s from this run's 43.5 (one replica at the knee, 22.86 req/s; the line above the cost table says how).",
     "arm"),
]


@pytest.mark.parametrize("text,word", QUALIFIED, ids=["verdict", "not this run", "instance"])
def test_the_shortener_keeps_what_qualifies_a_number_or_moves_the_line_whole(text: str, word: str) -> None:
    assert any(word in q for q in prepare.qualifiers(text))
    for limit in (80, 120, rules.BULLET_MAX_CHARS, rules.PROSE_MAX_CHARS):
        short = prepare.shorten(text, limit)
        assert short is None or (len(short) <= limit and prepare.qualifiers(short) >= prepare.qualifiers(text)), short
    assert prepare.shorten(text, 40) is None  # no 40-character cut keeps them all: the whole line goes to the notes
    deck = _deck([_md("## Takeaways", "slide"), _code("findings.show(found)", "-", [_out(f"- {text}\n- short one.\n")])])
    page = deck.cells[1].outputs[0]["data"]["text/html"]
    for item in re.findall(r"<li>(.*?)</li>", page):
        assert prepare.qualifiers(item) >= prepare.qualifiers(text) or item == "short one.", item


def test_the_old_cut_lost_a_qualifier_and_the_new_one_does_not() -> None:
    """The review's case: "bf16 8.20× (implausible — rerun)" became "bf16 8.20×" on the slide."""
    text = "bf16 8.20× fp32's decode speed (implausible — rerun) with half the bytes, agreement 0.972 over 24 tokens"
    dropped = re.sub(r"\s*\([^()]*\)", "", text)  # what dropping asides alone does
    assert "implausible" not in dropped and "implausible" in prepare.shorten(text, 90)


def test_a_code_listing_spans_at_most_code_max_slides() -> None:
    body = "\n\n".join(f"def step_{i}(x):\n    y = x + {i}\n    return y * 2" for i in range(40))
    listing = nbformat.v4.new_output("display_data", data={"text/html": f"<pre>{body}</pre>", "text/plain": body})
    deck = _deck([_md("## Mechanism", "slide"), _code(body, "-", tags=["mechanism"]),
                  _md("## Listing", "slide"), _code("show_source(f)", "-", [listing])])
    source_cells = [c for c in deck.cells if c.cell_type == "code" and _shown_source(c)]
    outputs = [o for c in deck.cells if c.cell_type == "code" and not _shown_source(c) for o in c.outputs]
    assert 1 < len(source_cells) <= rules.CODE_MAX_SLIDES and 1 < len(outputs) <= rules.CODE_MAX_SLIDES
    assert re.search(r"# … \d+ more lines in the notebook$", source_cells[-1].source)
    assert "more lines in the notebook" in outputs[-1]["data"]["text/plain"]
    assert "step_0" in source_cells[0].source and "step_39" not in "".join(c.source for c in source_cells)


def test_tables_name_columns_in_words_round_long_numbers_and_drop_a_counting_index() -> None:
    t = tables.trim_table(_frame_html(3, {"variant": ["fp32", "fp16", "bf16"], "decode_tokens_per_s": [14.123456, 19.5, 23.0],
                                          "ttft_s": [0.4562898, 1.2, 0.9], "peak_rss_bytes": [1234567890, 1, 2]}))
    head = t.html[:t.html.index("</thead>")]
    assert "decode tokens/s" in head and "TTFT (s)" in head and "peak RSS (bytes)" in head and "_" not in head
    assert ">14.12<" in t.html and ">0.4563<" in t.html and ">1234567890<" in t.html
    assert "<th>0</th>" not in t.html and "<th></th>" not in t.html, "a plain 0, 1, 2 row index says nothing"
    assert tables.short_number("115.328") == "115.3" and tables.short_number("27235713024.5") == "27235713024"


def test_unmade_exercises_and_a_bare_returned_number_stay_off_the_slides() -> None:
    stream = _out("using labkit's weight bytes from a config: exercise 01.weight_bytes is not attempted\n"
                  "using your decode ceiling (exercise 01.decode_ceiling)\nfp16 weights: 257 MiB\n")
    shown = nbformat.v4.new_output("execute_result", data={"text/plain": "0"}, execution_count=1)
    deck = _deck([_md("## Reference", "slide"),
                  _code("x()", "-", [stream]),
                  _code("references.show('02', 'variants', source='gpu')", "-", [_out("No GPU reference of 02 ships yet.\n"), shown])])
    texts = [o.get("text", "") or o.get("data", {}).get("text/plain", "") for c in deck.cells[1:] for o in c.outputs]
    assert texts == ["using your decode ceiling (exercise 01.decode_ceiling)\nfp16 weights: 257 MiB\n",
                     "No GPU reference of 02 ships yet.\n"]



def test_printed_words_are_counted_for_the_agenda_and_charts_are_not() -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print(...)", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="decode 26.8 tokens/s at batch one\n"),
        nbformat.v4.new_output("stream", name="stderr", text="a warning nobody reads here\n"),
        nbformat.v4.new_output("display_data", data={"text/html": "<div class='plotly'>…</div>", "text/plain": "Figure"}),
        nbformat.v4.new_output("execute_result", data={"text/plain": "   variant  tokens\n0     fp32    26.8"},
                               execution_count=1)])]
    assert summary.output_words(nb) == 5 + 3  # "decode tokens at batch one"; the table's "variant tokens fp"
