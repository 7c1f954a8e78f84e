"""Driving JupyterLab 4 from Playwright: open a notebook, run up to a cell, move a slider, read a plot."""
from __future__ import annotations

import json
import re
from typing import Any

KERNEL_START_TIMEOUT_MS = 120_000


def open_notebook(page: Any, url: str) -> Any:
    """Open a notebook and wait until its kernel is idle; returns the notebook panel locator."""
    page.goto(url)
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
    panel.locator(".jp-Cell").first.wait_for(timeout=KERNEL_START_TIMEOUT_MS)
    wait_idle(page)
    return panel


def wait_idle(page: Any, timeout_ms: int = KERNEL_START_TIMEOUT_MS) -> None:
    """The status bar says the notebook's kernel is connected and idle ("Python 3 (ipykernel) | Idle").

    The toolbar indicator says idle before the kernel is connected, and a cell run then is dropped."""
    page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\| Idle$")).first.wait_for(timeout=timeout_ms)


def cell_containing(panel: Any, text: str) -> Any:
    """The one code cell whose source contains ``text``."""
    cells = panel.locator(".jp-CodeCell").filter(has=panel.page.locator(".jp-InputArea", has_text=text))
    cells.first.wait_for(timeout=30_000)  # editors fill in after the panel appears
    n = cells.count()
    assert n == 1, f"expected one code cell containing {text!r}, found {n}"
    return cells.first


def select(cell: Any) -> None:
    """Select a cell in command mode (a click on its prompt, not into the editor)."""
    cell.locator(".jp-InputPrompt").first.click()
    cell.page.wait_for_function("document.activeElement && document.activeElement.classList.contains('jp-mod-active')")


def run_through(page: Any, cell: Any, timeout_ms: int) -> None:
    """Run every cell from the top down to ``cell`` (Shift+Enter each, then Ctrl+Enter on ``cell``,
    as a learner does) and wait until ``cell`` shows its execution count."""
    from playwright.sync_api import expect

    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
    target = cell.evaluate("el => [...el.parentElement.children].filter(c => c.classList.contains('jp-Cell')).indexOf(el)")
    assert target >= 0, "cell not found among the notebook's cells"
    select(panel.locator(".jp-Cell").first)
    for _ in range(target):
        page.keyboard.press("Shift+Enter")
    page.keyboard.press("Control+Enter")
    expect(cell.locator(".jp-InputPrompt").first).to_have_text(re.compile(r"\[\d+\]"), timeout=timeout_ms)
    wait_idle(page, timeout_ms)


def run_cells(page: Any, indices: list[int], timeout_ms: int) -> None:
    """Run only these cells (0-based notebook positions), in order, each with Ctrl+Enter, as a
    learner who jumps to a section does; each must show its execution count before the next."""
    panel = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)").first
    for i in indices:
        cell = panel.locator(".jp-Cell").nth(i)
        run_cell(cell, timeout_ms)
    wait_idle(page, timeout_ms)


def run_cell(cell: Any, timeout_ms: int, tries: int = 3, accepted_ms: int = 15_000) -> None:
    """Select ``cell``, press Ctrl+Enter, and wait for its execution count. A run sent while the
    kernel is still connecting is dropped (the prompt stays ``[ ]``): then press again, as a learner would."""
    from playwright.sync_api import expect

    prompt = cell.locator(".jp-InputPrompt").first
    for attempt in range(1, tries + 1):
        select(cell)
        cell.page.keyboard.press("Control+Enter")
        try:  # queued or running ([*]) or already done ([n])
            expect(prompt).to_have_text(re.compile(r"\[(\*|\d+)\]"), timeout=accepted_ms)
            break
        except AssertionError:
            if attempt == tries:
                raise AssertionError(f"the cell was not accepted for execution after {tries} tries "
                                     f"({prompt.inner_text()!r})") from None
    expect(prompt).to_have_text(re.compile(r"\[\d+\]"), timeout=timeout_ms)


def errors_in(panel: Any) -> list[str]:
    """Text of every error output in the notebook (a failed cell above the widget)."""
    return panel.locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']") \
        .filter(has_text="Traceback").all_inner_texts() + \
        panel.locator(".jp-RenderedText[data-mime-type='application/vnd.jupyter.error']").all_inner_texts()


def slider(scope: Any, label: str) -> Any:
    """An ipywidgets slider (Int/Float/Selection) by its description."""
    box = scope.locator(".widget-slider").filter(has=scope.page.locator(".widget-label", has_text=label))
    assert box.count() >= 1, f"no slider labelled {label!r} in this output"
    return box.first


def slider_value(box: Any) -> str:
    return box.locator(".widget-readout").first.inner_text().strip()


def nudge(box: Any, key: str = "ArrowRight") -> None:
    """Move a slider one step with the keyboard, as a learner can."""
    handle = box.locator(".noUi-handle").first
    handle.focus()
    handle.press(key)


# x and y as plain arrays: plotly.js may hold them as typed arrays (decoded from base64 "bdata")
PLOT_DATA_JS = """els => els.map(el => JSON.stringify((el.data || []).map(t => [t.type, t.name,
    t.x ? Array.from(t.x) : t.x, t.y ? Array.from(t.y) : t.y])))"""


def plot_data(scope: Any) -> list[str]:
    """The traces (type, name, x, y) of every rendered plotly plot in ``scope``, as JSON strings."""
    return scope.locator(".js-plotly-plot").evaluate_all(PLOT_DATA_JS)


def describe(data: list[str]) -> str:
    return json.dumps([d[:200] for d in data])
