import pytest

from labkit.core import config
from labkit.lessons import widgets

CONFIGS = config.DATA_DIR / "configs"


def test_model_choices_lists_shipped_configs():
    choices = widgets.model_choices()
    assert "Llama-3.1-8B" in choices and "SmolLM2-135M-Instruct" in choices


def test_sizing_answer_fit_and_ceiling():
    small = widgets.sizing_answer(str(CONFIGS / "Llama-3.1-8B"), "fp16", 4096, 1, "H100-SXM")
    assert small["fits"] is True and small["ceiling_tokens_per_s"] > 100
    big = widgets.sizing_answer(str(CONFIGS / "Llama-3.1-8B"), "fp16", 4096, 1, "T4")
    assert big["fits"] is False
    # quantising to nf4 makes it fit on the T4 and raises the ceiling
    q = widgets.sizing_answer(str(CONFIGS / "Llama-3.1-8B"), "nf4", 4096, 1, "T4")
    assert q["fits"] is True and q["ceiling_tokens_per_s"] > big["ceiling_tokens_per_s"]
    html = widgets.sizing_html(big)
    assert "does not fit" in html


def test_panel_builds_and_updates():
    panel = widgets.sizing_panel()
    out = panel.children[-1]
    before = out.value
    batch = panel.children[1].children[1]
    batch.value = 64
    assert out.value != before


def _fake_measure(max_batch_size: int, max_wait_ms: float, clients: int) -> dict:
    return {"max_batch_size": max_batch_size, "max_wait_ms": max_wait_ms, "clients": clients, "requests": clients,
            "failed": 0, "output_tokens_per_s": 10.0 * max_batch_size, "e2e_p50_s": 1.0 + max_batch_size / 10,
            "ttft_p50_s": 0.1, "duration_s": 1.0, "tokens_per_s_per_user": 5.0}


def test_panel_callback_updates_figure_in_place():
    fig = widgets.make_figure(widget=True)
    state = widgets.PanelState()
    widgets.on_change(state, fig, {"max_batch_size": 4, "max_wait_ms": 20, "clients": 8}, _fake_measure)
    widgets.on_change(state, fig, {"max_batch_size": 1, "max_wait_ms": 20, "clients": 8}, _fake_measure)
    assert list(fig.data[0].x) == [1, 4] and list(fig.data[0].y) == [10.0, 40.0]
    assert list(fig.data[1].y) == [1.1, 1.4]
    assert list(fig.data[2].x) == [1]  # the latest point is circled
    # another client count starts its own curve; re-measuring a setting replaces its point
    widgets.on_change(state, fig, {"max_batch_size": 2, "max_wait_ms": 20, "clients": 4}, _fake_measure)
    assert list(fig.data[0].x) == [2]
    widgets.on_change(state, fig, {"max_batch_size": 2, "max_wait_ms": 20, "clients": 4}, _fake_measure)
    assert len(state.points) == 3
    assert "4 clients" in fig.layout.title.text


def test_panel_widgets_follow_the_slider(monkeypatch):
    calls = []

    seen = []

    def fake(server, max_tokens, progress=None, superseded=None, rounds=1, max_rounds=None, on_round=None, **values):
        calls.append(values)
        if progress:
            progress(1, 1)
        if on_round is not None and "box" in seen:  # the point so far is shown while it is measured
            on_round({**_fake_measure(**values), "rounds": 2, "requests": 16, "spread": 0.05, "partial": True})
            status = box.children[1].children[1].value
            seen.append((status, box.figure.layout.title.text, list(box.figure.data[2].x), list(box.figure.data[0].x)))
        return _fake_measure(**values)

    monkeypatch.setattr(widgets, "measure_point", fake)
    box = widgets.panel(server=object(), batch_size=8, clients=8)
    assert box.measurer.wait(30)  # measuring runs in the background: the cell returned at once
    assert [c["max_batch_size"] for c in calls] == [8, 8]  # an untimed warm-up burst, then the first point
    assert len(box.state.points) == 1 and list(box.figure.data[0].x) == [8]
    slider = box.controls["batch"]
    assert slider.description == "batch size"
    seen.append("box")
    slider.value = 2
    assert box.measurer.wait(30)
    status, title, circled, curve = seen[-1]
    assert "round 2, 16 requests done" in status and "tokens/s so far, spread 5%" in status, status
    assert "warm-up burst:" in status and title.endswith("(so far)") and circled == [2] and curve == [8]
    assert "warm-up burst:" in box.children[1].children[1].value  # the finished point's status keeps it
    box.measurer.close(30)
    assert calls[-1]["max_batch_size"] == 2 and list(box.figure.data[0].x) == [2, 8]


def test_measure_point_refuses_a_stopped_server():
    class Stopped:
        running = False

    with pytest.raises(RuntimeError, match="stopped"):
        widgets.measure_point(Stopped(), 4, 20, 2)
    with pytest.raises(ValueError, match="clients"):
        widgets.measure_point(Stopped(), 4, 20, 0)


def test_batch_panel_measures_against_a_live_server(server):
    point = widgets.measure_point(server, max_batch_size=4, max_wait_ms=10, clients=4, max_tokens=3)
    assert point["failed"] == 0 and point["requests"] == 4 and point["output_tokens_per_s"] > 0
    assert server.config.max_batch_size == 4 and server.config.max_wait_ms == 10
