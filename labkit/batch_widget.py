"""The live batching panel: move batch size, max wait or clients, and a short load test redraws the plot.

The panel drives an in-process server (``serving.start_server``): a change reconfigures its batching,
``loadgen`` sends one streaming request per client, and the point (total output tokens/s and median
latency) joins the curve for the current clients and max wait. The callback logic (``measure_point``,
``PanelState``, ``update_figure``, ``on_change``) is plain Python, tested without a browser.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import loadgen

MAX_BATCH = 16
MAX_CLIENTS = 16


def measure_point(server: Any, max_batch_size: int, max_wait_ms: float, clients: int, max_tokens: int = 8,
                  requests_per_client: int = 1, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Reconfigure ``server`` and run a short load test: ``clients`` concurrent streams, a few seconds."""
    if isinstance(clients, bool) or not isinstance(clients, int) or clients <= 0:
        raise ValueError(f"clients={clients!r}: must be a positive integer")
    if not getattr(server, "running", False):
        raise RuntimeError("the panel's server has stopped: run the panel cell again")
    server.configure(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
    res = loadgen.run(server.url, num_requests=clients * requests_per_client, max_concurrency=clients,
                      max_tokens=max_tokens, ignore_eos=True, warmup=0, progress=progress)
    s = res.summary()
    return {"max_batch_size": max_batch_size, "max_wait_ms": max_wait_ms, "clients": clients,
            "requests": s["requests"], "failed": s["failed"], "output_tokens_per_s": s["output_tokens_per_s"],
            "tokens_per_s_per_user": (1 / s["tpot_p50_s"]) if s["tpot_p50_s"] else None,
            "ttft_p50_s": s["ttft_p50_s"], "e2e_p50_s": s["e2e_p50_s"], "duration_s": s["duration_s"]}


@dataclass
class PanelState:
    """Every point measured so far; a re-measured setting replaces its old point."""

    points: list[dict[str, Any]] = field(default_factory=list)

    def add(self, point: dict[str, Any]) -> None:
        key = (point["max_batch_size"], point["max_wait_ms"], point["clients"])
        self.points = [p for p in self.points if (p["max_batch_size"], p["max_wait_ms"], p["clients"]) != key]
        self.points.append(point)

    def curve(self, max_wait_ms: float, clients: int) -> list[dict[str, Any]]:
        """Points at this max wait and client count, by batch size."""
        same = [p for p in self.points if p["max_wait_ms"] == max_wait_ms and p["clients"] == clients]
        return sorted(same, key=lambda p: p["max_batch_size"])


def make_figure(widget: bool = True):
    """Throughput (left axis) and median latency (right axis) against batch size; a FigureWidget by default."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    base = make_subplots(specs=[[{"secondary_y": True}]])
    base.add_scatter(x=[], y=[], mode="lines+markers", name="total output tokens/s", secondary_y=False)
    base.add_scatter(x=[], y=[], mode="lines+markers", name="median E2E latency (s)", line={"dash": "dash"},
                     secondary_y=True)
    base.add_scatter(x=[], y=[], mode="markers", name="just measured", marker={"size": 14, "symbol": "circle-open"},
                     secondary_y=False)
    base.update_layout(template="plotly_white", height=380, title="move a slider to measure",
                       xaxis_title="max batch size", legend={"orientation": "h", "y": -0.25})
    base.update_yaxes(title_text="output tokens/s (all clients)", secondary_y=False, rangemode="tozero")
    base.update_yaxes(title_text="median latency per request (s)", secondary_y=True, rangemode="tozero")
    return go.FigureWidget(base) if widget else base


def update_figure(fig: Any, state: PanelState, current: dict[str, Any]) -> None:
    """Redraw in place: the curve for the current max wait and clients, the latest point circled."""
    curve = state.curve(current["max_wait_ms"], current["clients"])
    x = [p["max_batch_size"] for p in curve]
    with fig.batch_update():
        fig.data[0].x, fig.data[0].y = x, [p["output_tokens_per_s"] for p in curve]
        fig.data[1].x, fig.data[1].y = x, [p["e2e_p50_s"] for p in curve]
        fig.data[2].x, fig.data[2].y = [current["max_batch_size"]], [current["output_tokens_per_s"]]
        fig.layout.title.text = (f"{current['clients']} clients, max wait {current['max_wait_ms']:g} ms: "
                                 f"batch {current['max_batch_size']} → {current['output_tokens_per_s']:.1f} tokens/s, "
                                 f"median latency {current['e2e_p50_s']:.2f} s")


def on_change(state: PanelState, fig: Any, values: dict[str, Any],
              measure: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """What a slider change does: measure at ``values``, remember the point, redraw."""
    point = measure(**values)
    state.add(point)
    update_figure(fig, state, point)
    return point


def panel(server: Any, batch_size: int = 8, max_wait_ms: int = 20, clients: int = 8, max_tokens: int = 8,
          measure_now: bool = True):
    """The ipywidgets panel. ``server``: a running ``serving.start_server`` handle (in this process)."""
    import ipywidgets as w

    batch = w.IntSlider(value=batch_size, min=1, max=MAX_BATCH, description="batch size", continuous_update=False)
    wait = w.IntSlider(value=max_wait_ms, min=0, max=200, step=10, description="max wait (ms)",
                       continuous_update=False, style={"description_width": "initial"})
    users = w.IntSlider(value=clients, min=1, max=MAX_CLIENTS, description="clients", continuous_update=False)
    bar = w.IntProgress(value=0, min=0, max=clients, description="idle", bar_style="info")
    status = w.HTML()
    fig = make_figure()
    state = PanelState()

    def progress(done: int, total: int) -> None:
        bar.max, bar.value = total, done

    def measure(**values: Any) -> dict[str, Any]:
        return measure_point(server, max_tokens=max_tokens, progress=progress, **values)

    def update(_change: Any = None) -> None:
        values = {"max_batch_size": batch.value, "max_wait_ms": wait.value, "clients": users.value}
        bar.value, bar.max, bar.description, bar.bar_style = 0, users.value, "measuring", "warning"
        status.value = "<i>measuring…</i>"
        try:
            point = on_change(state, fig, values, measure)
        except (RuntimeError, ValueError) as exc:
            bar.description, bar.bar_style = "failed", "danger"
            status.value = f"<b>measurement failed:</b> {exc}"
            return
        bar.description, bar.bar_style = "done", "success"
        status.value = (f"{point['requests']} requests in {point['duration_s']:.1f} s, {point['failed']} failed; "
                        f"TTFT p50 {point['ttft_p50_s']:.2f} s")

    for control in (batch, wait, users):
        control.observe(update, names="value")
    if measure_now:
        # one untimed burst at the first setting: a fresh server's first batch pays allocation and
        # kernel set-up, which would make the first point look slower than any later one
        bar.description, status.value = "warming up", "<i>one untimed burst first…</i>"
        try:
            measure_point(server, max_tokens=2, progress=progress, max_batch_size=batch.value,
                          max_wait_ms=wait.value, clients=users.value)
        except (RuntimeError, ValueError):
            pass  # update() below reports the failure
        update()
    box = w.VBox([w.HBox([batch, wait, users]), w.HBox([bar, status]), fig])
    box.state, box.figure, box.controls = state, fig, {"batch": batch, "wait": wait, "clients": users}  # for tests
    return box
