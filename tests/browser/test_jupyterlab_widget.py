"""JupyterLab in a real browser: run the batching widget, move 'batch size' twice in quick succession,
see the plot show the second setting, and run a cell while the panel measures in the background.

The same harness first drives a small stand-in notebook (a 'batch size' slider redrawing a
plotly figure), so a broken harness is told apart from a broken widget.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import nbformat
import pytest

import jlab
from conftest import ROOT, LabServer, copy_notebook, screenshot_path

pytestmark = pytest.mark.browser

BATCHING = ROOT / "notebooks" / "06_batching.ipynb"
WIDGET_CALL = "batch_widget("  # the cell in 06 that shows the widget (labkit.lessons.widgets.panel)
RUN_TIMEOUT_MS = int(os.environ.get("LABKIT_LAB_RUN_TIMEOUT_MS", 420_000))  # cells above the widget, quick mode, 2 CPU cores
CHANGE_TIMEOUT_MS = 120_000  # the least time one re-measurement after the slider moves gets
# a point is at most MAX_ROUNDS rounds of 8-token requests, each at most ~4x the panel's 2-token warm-up burst;
# the deadline for a point is SAFETY times that, from the burst the panel measured and shows
MAX_ROUNDS, ROUND_PER_BURST, SAFETY = 12, 4, 3
# appended to the copy of 06 the browser runs: `_` is the panel, the cell run just before it
PROBE = 'print("panel measuring while this cell ran:", _.measurer.busy)'

STAND_IN_CELLS = [  # shaped like labkit.lessons.widgets.panel: a slider redraws a plotly FigureWidget in place
    "import ipywidgets as w\nimport plotly.graph_objects as go",
    "# stand-in widget\n"
    "size = w.IntSlider(value=1, min=1, max=8, description='batch size', continuous_update=False)\n"
    "fig = go.FigureWidget(go.Scatter(x=[1, 2, 3], y=[1, 2, 3], name='latency'))\n"
    "def redraw(_change=None):\n"
    "    fig.data[0].y = [size.value * k for k in (1, 2, 3)]\n"
    "size.observe(redraw, names='value')\n"
    "w.VBox([size, fig])",
]


def _stand_in(path: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in STAND_IN_CELLS]
    nb.metadata = {"kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}}
    nbformat.write(nb, path)
    return path


def cells_for_widget(nb: nbformat.NotebookNode, marker: str) -> list[int]:
    """What a learner jumping to the live section runs: the set-up cell, the first code cell after it (imports),
    the parameters cell, the model load, then the widget cell (positions in the notebook)."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    widget = [i for i in code if marker in nb.cells[i].source]
    assert len(widget) == 1, f"expected one cell calling {marker!r}, found {len(widget)}"
    setup = [i for i in code if "setup" in nb.cells[i].metadata.get("tags", [])]
    imports = next(i for i in code if i not in setup)
    needed = {*setup, imports, widget[0]}
    needed |= {i for i in code if "parameters" in nb.cells[i].metadata.get("tags", [])
               or "models.load(" in nb.cells[i].source}
    return sorted(i for i in needed if i <= widget[0])


def _drive(page, lab: LabServer, notebook: str, marker: str, label: str, shot: str,
           only: list[int] | None = None, moves: int = 1, probe: int | None = None) -> dict:
    """Open, run the cells up to the widget (all above, or ``only`` these), move the slider ``moves``
    steps in quick succession, run cell ``probe`` right after (when given), and wait for the plot to
    change; returns the plot data before and after, the slider's values and the probe's output."""
    panel = jlab.open_notebook(page, lab.open_url(notebook))
    cell = jlab.cell_containing(panel, marker)
    try:
        if only is None:
            jlab.run_through(page, cell, RUN_TIMEOUT_MS)
        else:
            jlab.run_cells(page, only, RUN_TIMEOUT_MS)
    finally:
        page.screenshot(path=str(screenshot_path(f"{shot}-ran")))
    errors = jlab.errors_in(panel)
    assert not errors, f"{notebook}: a cell failed before the widget could be used:\n" + "\n".join(errors)[-3000:]
    output = cell.locator(".jp-Cell-outputWrapper")
    box = jlab.slider(output, label)
    output.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=CHANGE_TIMEOUT_MS)
    deadline = deadline_ms(output)
    # the widget's first finished measurement is drawn (a curve has points; the circled point so far is not one)
    output.locator(".js-plotly-plot").first.evaluate(
        "el => new Promise((ok, fail) => { const t0 = Date.now(); (function poll() {"
        " if ((el.data || []).some(t => t.name !== 'just measured' && t.x && t.x.length)) return ok(true);"
        f" if (Date.now() - t0 > {deadline}) return fail(new Error('plot stays empty after {deadline} ms'));"
        " setTimeout(poll, 250); })(); })")
    before = jlab.plot_data(output)
    value_before = jlab.slider_value(box)
    cell.scroll_into_view_if_needed()
    page.screenshot(path=str(screenshot_path(f"{shot}-before")))
    for _ in range(moves):  # as quick as a learner's key presses: each step reaches the kernel
        jlab.nudge(box)
        page.wait_for_timeout(150)
    value_after = jlab.slider_value(box)
    probe_text = None
    if probe is not None:
        jlab.run_cells(page, [probe], CHANGE_TIMEOUT_MS)
        probe_text = panel.locator(".jp-Cell").nth(probe).locator(".jp-OutputArea-output").inner_text()
    page.wait_for_function(
        f"""before => {{
            const els = [...document.querySelectorAll('.jp-Cell')].filter(c => c.innerText.includes({marker!r}));
            if (els.length !== 1) return false;
            const now = ({jlab.PLOT_DATA_JS})([...els[0].querySelectorAll('.jp-Cell-outputWrapper .js-plotly-plot')]);
            return now.length > 0 && JSON.stringify(now) !== JSON.stringify(before);
        }}""", arg=before, timeout=deadline)
    jlab.wait_idle(page, deadline)
    after = jlab.plot_data(output)
    assert value_after != value_before, "the slider did not move"
    page.screenshot(path=str(screenshot_path(f"{shot}-after")))
    return {"before": before, "after": after, "value_before": value_before, "value_after": value_after,
            "probe": probe_text, "status": output.locator(".widget-html").first.inner_text()
            if output.locator(".widget-html").count() else ""}


def deadline_ms(output) -> int:
    """How long one point may take: from the warm-up burst the panel timed and shows, when it shows one."""
    html = output.locator(".widget-html")
    if not html.count():
        return CHANGE_TIMEOUT_MS  # the stand-in: no panel, no burst
    handle = html.first.element_handle()
    try:
        html.first.page.wait_for_function("el => /warm-up burst: [0-9.]+ s/.test(el.innerText)", arg=handle,
                                          timeout=RUN_TIMEOUT_MS)
    except Exception:
        return CHANGE_TIMEOUT_MS
    burst_s = float(re.search(r"warm-up burst: ([0-9.]+) s", html.first.inner_text()).group(1))
    return max(CHANGE_TIMEOUT_MS, int(SAFETY * MAX_ROUNDS * ROUND_PER_BURST * burst_s * 1000))


def test_harness_sees_a_plot_follow_the_slider(lab_server: LabServer, offline_page, tmp_path: Path) -> None:
    name = copy_notebook(_stand_in(tmp_path / "stand_in_widget.ipynb"), lab_server)
    run = _drive(offline_page, lab_server, name, "# stand-in widget", "batch size", "lab-stand-in", moves=2)
    assert run["before"] != run["after"]
    final = int(run["value_after"])
    output = jlab.cell_containing(offline_page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first,
                                  "# stand-in widget").locator(".jp-Cell-outputWrapper")
    offline_page.wait_for_function(  # the plot shows the second move's value
        "([el, want]) => JSON.stringify(Array.from((el.data || [])[0].y || [])) === JSON.stringify(want)",
        arg=[output.locator(".js-plotly-plot").first.element_handle(), [final * k for k in (1, 2, 3)]],
        timeout=CHANGE_TIMEOUT_MS)
    leaks = offline_page.network.blocked_except_plotly_mathjax()
    assert not leaks, f"requests left 127.0.0.1: {leaks}"


def _with_probe(src: Path, dst: Path) -> tuple[Path, int]:
    nb = nbformat.read(src, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(PROBE))
    nbformat.write(nb, dst)
    return dst, len(nb.cells) - 1


@pytest.mark.skipif(not BATCHING.is_file(), reason="notebooks/06_batching.ipynb does not exist yet "
                    "(its batching widget, labkit.lessons.widgets, is being written)")
def test_batching_widget_follows_two_quick_moves(lab_server: LabServer, offline_page, tmp_path: Path) -> None:
    """Two key presses on 'batch size' in a row: the panel drops the first setting's point (or finishes
    it) and draws the second; a cell run right after the moves answers while the panel measures."""
    copy, probe = _with_probe(BATCHING, tmp_path / BATCHING.name)
    name = copy_notebook(copy, lab_server)
    only = cells_for_widget(nbformat.read(BATCHING, as_version=4), WIDGET_CALL)
    run = _drive(offline_page, lab_server, name, WIDGET_CALL, "batch size", "lab-06-batching", only,
                 moves=2, probe=probe)
    assert "measuring while this cell ran: True" in run["probe"], \
        f"the kernel ran a cell only after the measurement ended (the panel blocks it): {run['probe']!r}"
    first, final = int(run["value_before"]), int(run["value_after"])
    assert final == first + 2, f"two steps from {first} should give {first + 2}, the slider says {final}"
    output_cell = jlab.cell_containing(offline_page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first,
                                       WIDGET_CALL).locator(".jp-Cell-outputWrapper")
    offline_page.wait_for_function(  # the final setting's finished point is on the curve, not just circled so far
        """([el, want]) => (el.data || []).some(t => t.name && t.name.includes('latency') && t.x
                                                      && Array.from(t.x).map(Number).includes(want))""",
        arg=[output_cell.locator(".js-plotly-plot").first.element_handle(), final], timeout=deadline_ms(output_cell))
    traces = {t[1]: t for t in json.loads(jlab.plot_data(output_cell)[0])}
    latency = [t for n, t in traces.items() if n and "latency" in n]
    assert latency, f"no latency curve: {traces}"
    xs, ys = latency[0][2], latency[0][3]
    assert first in xs and final in xs, f"the curve should hold batch {first} and {final}: {traces}"
    assert all(y is not None and y > 0 for y in ys), f"latencies must be positive: {ys}"
    status = output_cell.locator(".widget-html").first.inner_text()
    assert "measurement failed" not in status, f"the panel reports a failure: {status}"
    output_cell.scroll_into_view_if_needed()
    offline_page.screenshot(path=str(screenshot_path("lab-06-batching-final")))
    leaks = offline_page.network.blocked_except_plotly_mathjax()
    assert not leaks, f"requests left 127.0.0.1: {leaks}"
