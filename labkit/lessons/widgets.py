"""Live panels for the notebooks. Each callback is a plain function, tested without a browser."""
from __future__ import annotations

import html

import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import config, timing
from ..core.checks import positive
from ..model import dtypes, gpus, sizing
from ..serve import client, loadgen

CONFIGS_DIR = config.DATA_DIR / "configs"


def model_choices() -> dict[str, str]:
    """Public model configs shipped in data/configs: label → directory."""
    return {p.name: str(p) for p in sorted(CONFIGS_DIR.iterdir()) if (p / "config.json").is_file()}


def sizing_answer(model: str, dtype: str, context: int, batch: int, gpu: str) -> dict[str, Any]:
    """Does it fit, and how fast can it decode at most? One dict for the panel to show."""
    est = sizing.estimate(model, dtype=dtype, context=context, batch=batch, gpu=gpu)
    assert est.fits is not None and est.decode_tokens_per_s_ceiling is not None
    return {
        "model": Path(model).name, "gpu": est.gpu, "dtype": est.dtype,
        "weights_gib": est.weight_bytes / 2**30, "kv_gib": est.kv_bytes / 2**30,
        "total_gib": est.total_bytes / 2**30, "gpu_gib": est.gpu_memory_bytes / 2**30,
        "fits": est.fits,
        "ceiling_tokens_per_s": est.decode_tokens_per_s_ceiling,
        "ceiling_per_sequence": est.decode_tokens_per_s_per_sequence_ceiling,
        "compute_bound_batch": est.compute_bound_batch,
        "kv_naive_gib": est.kv_bytes_naive / 2**30, "active_weights_gib": est.active_weight_bytes / 2**30,
    }


def sizing_html(ans: dict[str, Any]) -> str:
    verdict = ("<b style='color:#1a7f37'>fits</b>" if ans["fits"]
               else "<b style='color:#cf222e'>does not fit</b>")
    cb = ans["compute_bound_batch"]
    cb_text = f"{cb:,.0f}" if cb is not None else "never at this context (KV reads grow faster than compute)"
    layered = (f" (layer by layer; the formula 2 × layers × KV heads × head_dim says {ans['kv_naive_gib']:.2f} GiB)"
               if abs(ans.get("kv_naive_gib", ans["kv_gib"]) - ans["kv_gib"]) > 1e-9 else "")
    active = (f" A token reads {ans['active_weights_gib']:.2f} GiB of the weights (its experts only)."
              if ans.get("active_weights_gib", ans["weights_gib"]) < ans["weights_gib"] else "")
    return (f"<p>{ans['model']} in {ans['dtype']} on {ans['gpu']}: {verdict} — "
            f"weights {ans['weights_gib']:.2f} GiB + KV {ans['kv_gib']:.2f} GiB = {ans['total_gib']:.2f} GiB "
            f"of {ans['gpu_gib']:.0f} GiB{layered}.{active}</p>"
            f"<p>Decode ceiling: <b>{ans['ceiling_tokens_per_s']:,.0f} tokens/s</b> in total, "
            f"{ans['ceiling_per_sequence']:,.0f} per sequence. Compute-bound above batch: {cb_text}.</p>")


def sizing_panel(default_model: str | None = None):
    """Sliders for model, precision, context, batch and GPU; the answer updates live."""
    import ipywidgets as w

    models = model_choices()
    model = w.Dropdown(options=list(models.items()), value=models.get(default_model or "Llama-3.1-8B",
                       next(iter(models.values()))), description="model")
    dtype = w.Dropdown(options=list(dtypes.DTYPE_BYTES), value="fp16", description="precision")
    context = w.IntSlider(value=4096, min=256, max=131072, step=256, description="context")
    batch = w.IntSlider(value=1, min=1, max=256, description="batch")
    gpu = w.Dropdown(options=[g.name for g in gpus.catalog()], value="L4", description="GPU")
    out = w.HTML()

    def update(_change: Any = None) -> None:
        try:
            out.value = sizing_html(sizing_answer(model.value, dtype.value, context.value, batch.value, gpu.value))
        except ValueError as exc:  # a model this transformers cannot build: say so in the panel
            out.value = f"<p><b>Cannot size {Path(model.value).name}</b>: {html.escape(str(exc))}</p>"

    for control in (model, dtype, context, batch, gpu):
        control.observe(update, names="value")
    update()
    return w.VBox([w.HBox([model, dtype, gpu]), w.HBox([context, batch]), out])


MAX_BATCH = 16
MAX_CLIENTS = 16


class Superseded(Exception):
    """A newer setting was asked for while this point was being measured: the point is dropped."""


def measure_point(server: Any, max_batch_size: int, max_wait_ms: float, clients: int, max_tokens: int = 8,
                  requests_per_client: int = 1, progress: Callable[[int, int], None] | None = None, *,
                  rounds: int = 1, max_rounds: int | None = None,
                  superseded: Callable[[], bool] | None = None,
                  on_round: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Reconfigure ``server`` and measure one point: ``rounds`` bursts (up to ``max_rounds`` while the
    rounds' tokens/s spread exceeds ``timing.SPREAD_LIMIT``), each ``clients`` concurrent streams of
    ``requests_per_client`` requests. Total output tokens/s is the median of the rounds, with their
    p10/p90; latency percentiles are over every request. ``superseded()`` is asked between rounds:
    True raises ``Superseded``. ``on_round(point so far)`` is called after every round (``partial``: True)."""
    positive("clients", clients)
    if rounds < 1 or (max_rounds is not None and max_rounds < rounds):
        raise ValueError(f"rounds={rounds}, max_rounds={max_rounds}: need 1 ≤ rounds ≤ max_rounds")
    if not getattr(server, "running", False):
        raise RuntimeError("the panel's server has stopped: run the panel cell again")
    max_rounds = max_rounds or rounds
    server.configure(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
    per_round = clients * requests_per_client
    tps: list[float] = []
    outputs: list[client.RequestOutput] = []
    duration_s, done_rounds = 0.0, 0
    while True:
        if superseded is not None and superseded():
            raise Superseded(f"batch {max_batch_size}, max wait {max_wait_ms:g} ms, {clients} clients")
        if not getattr(server, "running", False):
            raise RuntimeError("the panel's server has stopped: run the panel cell again")
        done_before, planned = len(outputs), max(rounds, done_rounds + 1) * per_round
        report = None if progress is None else (lambda done, _total: progress(done_before + done, planned))
        res = loadgen.run(server.url, num_requests=per_round, max_concurrency=clients, max_tokens=max_tokens,
                          ignore_eos=True, warmup=0, progress=report)
        done_rounds += 1
        outputs += res.outputs
        duration_s += res.duration_s
        tokens_per_s = res.summary()["output_tokens_per_s"]
        if tokens_per_s:
            tps.append(tokens_per_s)
        if on_round is not None:
            on_round(summarise(max_batch_size, max_wait_ms, clients, tps, outputs, done_rounds, duration_s,
                               partial=True))
        steady = len(tps) < 2 or timing.Measurement.from_values("t", tps).spread <= timing.SPREAD_LIMIT
        if done_rounds >= max_rounds or (done_rounds >= rounds and steady):
            break
    point = summarise(max_batch_size, max_wait_ms, clients, tps, outputs, done_rounds, duration_s)
    ok = [o for o in outputs if o.success]
    if not ok:
        errors = sorted({f"{o.status or 'no response'}: {o.error[:120]}" for o in outputs})
        raise RuntimeError(f"every request failed ({len(outputs)}): {'; '.join(errors)}")
    return point


def summarise(max_batch_size: int, max_wait_ms: float, clients: int, tps: list[float],
              outputs: list[client.RequestOutput], rounds: int, duration_s: float, partial: bool = False
              ) -> dict[str, Any]:
    """One point from the rounds measured so far: median tokens/s with p10/p90, latency percentiles."""
    ok = [o for o in outputs if o.success]
    point: dict[str, Any] = {"max_batch_size": max_batch_size, "max_wait_ms": max_wait_ms, "clients": clients,
                             "rounds": rounds, "requests": len(outputs),
                             "failed": len(outputs) - len(ok), "duration_s": duration_s, "partial": partial}
    if tps:
        m = timing.Measurement.from_values("output tokens/s", tps, unit="tokens/s")
        point.update(output_tokens_per_s=m.median, output_tokens_per_s_p10=m.p10, output_tokens_per_s_p90=m.p90,
                     spread=m.spread, noisy=m.noisy)
    else:
        point.update(output_tokens_per_s=None, output_tokens_per_s_p10=None, output_tokens_per_s_p90=None,
                     spread=None, noisy=False)
    for name, values in (("e2e", [o.e2e_s for o in ok]), ("ttft", [o.ttft_s for o in ok])):
        point.update(timing.latency_summary(name, values, ("p10", "p50", "p90")))
    tpots = [o.tpot_s for o in ok if o.tpot_s]
    point["tokens_per_s_per_user"] = 1 / timing.percentile(tpots, 50) if tpots else None
    return point


class Measurer:
    """One background thread that measures the newest requested setting, one point at a time.

    ``request(values)`` returns at once. The worker calls ``measure(values, superseded)``, where
    ``superseded()`` turns True as soon as a newer request arrives (the measure function checks it
    between rounds and raises ``Superseded``). Every outcome reaches ``on_event(kind, values,
    detail)`` in the worker thread: "start", then "done" (detail: the point), "superseded", or
    "error" (detail: the exception; errors are reported, never dropped, and the worker goes on)."""

    def __init__(self, measure: Callable[[dict[str, Any], Callable[[], bool]], dict[str, Any]],
                 on_event: Callable[[str, dict[str, Any], Any], None], name: str = "labkit-batch-panel") -> None:
        self._measure = measure
        self._on_event = on_event
        self._cond = threading.Condition()
        self._ticket = 0  # bumped by every request: the newest one is the only one worth measuring
        self._wanted: tuple[int, dict[str, Any]] | None = None
        self._busy = False
        self._closed = False
        self.handler_errors: list[str] = []  # on_event's own failures, also printed to stderr
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def request(self, values: dict[str, Any]) -> int:
        """Ask for a point at ``values``; a point being measured for an older request is dropped."""
        with self._cond:
            if self._closed:
                raise RuntimeError("this panel is closed: run its cell again")
            self._ticket += 1
            self._wanted = (self._ticket, dict(values))
            self._cond.notify_all()
            return self._ticket

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._busy or self._wanted is not None

    def superseded(self, ticket: int) -> bool:
        with self._cond:
            return self._closed or self._ticket != ticket

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until nothing is pending or running (tests, scripts); False when ``timeout_s`` ran out."""
        with self._cond:
            return self._cond.wait_for(lambda: (self._wanted is None and not self._busy) or self._closed, timeout_s)

    def close(self, timeout_s: float | None = None) -> None:
        """Stop after the current round; a pending request is dropped."""
        with self._cond:
            self._closed = True
            self._wanted = None
            self._cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    def _emit(self, kind: str, values: dict[str, Any], detail: Any = None) -> None:
        try:
            self._on_event(kind, values, detail)
        except Exception:  # a broken display must not kill the worker: keep and print it
            text = traceback.format_exc()
            self.handler_errors.append(text)
            print(f"batch panel: showing '{kind}' failed:\n{text}", file=sys.stderr)

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._wanted is not None or self._closed)
                if self._closed:
                    return
                assert self._wanted is not None
                ticket, values = self._wanted
                self._wanted = None
                self._busy = True
            try:
                self._emit("start", values)
                try:
                    point = self._measure(values, lambda: self.superseded(ticket))
                except Superseded:
                    self._emit("superseded", values)
                except Exception as exc:  # shown in the panel by on_event, the worker goes on
                    self._emit("error", values, exc)
                else:
                    self._emit("done", values, point)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()


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
    """Throughput (left axis) and median latency (right axis) against batch size, p10–p90 as error
    bars; a FigureWidget by default."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    base = make_subplots(specs=[[{"secondary_y": True}]])
    base.add_scatter(x=[], y=[], mode="lines+markers", name="total output tokens/s (median of rounds)",
                     secondary_y=False)
    base.add_scatter(x=[], y=[], mode="lines+markers", name="median E2E latency (s)", line={"dash": "dash"},
                     secondary_y=True)
    base.add_scatter(x=[], y=[], mode="markers", name="just measured", marker={"size": 14, "symbol": "circle-open"},
                     secondary_y=False)
    base.update_layout(template="plotly_white", height=380, title="move a slider to measure",
                       xaxis_title="max batch size", legend={"orientation": "h", "y": -0.25})
    base.update_yaxes(title_text="output tokens/s (all clients)", secondary_y=False, rangemode="tozero")
    base.update_yaxes(title_text="median latency per request (s)", secondary_y=True, rangemode="tozero")
    return go.FigureWidget(base) if widget else base


def _bars(points: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """Error bars from ``key_p10``/``key_p90`` around ``key`` (none for points without them)."""
    lo_key, hi_key = (f"{key}_p10", f"{key}_p90") if not key.endswith("_s") else \
        (key.replace("_p50_s", "_p10_s"), key.replace("_p50_s", "_p90_s"))
    up, down = [], []
    for p in points:
        mid, lo, hi = p.get(key), p.get(lo_key), p.get(hi_key)
        up.append(hi - mid if None not in (mid, hi) else 0.0)
        down.append(mid - lo if None not in (mid, lo) else 0.0)
    return {"type": "data", "array": up, "arrayminus": down, "visible": True}


def describe(point: dict[str, Any]) -> str:
    """The panel's title: the setting, then the median with its spread (two lines)."""
    tps = point.get("output_tokens_per_s")
    text = (f"{point['clients']} clients, max wait {point['max_wait_ms']:g} ms, batch {point['max_batch_size']}<br>"
            + (f"{tps:.1f} tokens/s" if tps is not None else "no tokens"))
    if point.get("output_tokens_per_s_p10") is not None and point.get("rounds", 1) > 1:
        text += f" (p10–p90 {point['output_tokens_per_s_p10']:.1f}–{point['output_tokens_per_s_p90']:.1f})"
    if point.get("e2e_p50_s") is not None:
        text += f", median latency {point['e2e_p50_s']:.2f} s"
    if point.get("noisy"):
        text += f" · noisy: spread {point['spread']:.0%}"
    return text


def update_figure(fig: Any, state: PanelState, current: dict[str, Any]) -> None:
    """Redraw in place: the curve for the current max wait and clients, the latest point circled."""
    curve = state.curve(current["max_wait_ms"], current["clients"])
    x = [p["max_batch_size"] for p in curve]
    with fig.batch_update():
        fig.data[0].x, fig.data[0].y = x, [p["output_tokens_per_s"] for p in curve]
        fig.data[0].error_y = _bars(curve, "output_tokens_per_s")
        fig.data[1].x, fig.data[1].y = x, [p["e2e_p50_s"] for p in curve]
        fig.data[1].error_y = _bars(curve, "e2e_p50_s")
        fig.data[2].x, fig.data[2].y = [current["max_batch_size"]], [current["output_tokens_per_s"]]
        fig.layout.title.text = describe(current)


def on_change(state: PanelState, fig: Any, values: dict[str, Any],
              measure: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """Measure at ``values``, remember the point, redraw (what the worker does for each request)."""
    point = measure(**values)
    state.add(point)
    update_figure(fig, state, point)
    return point


def _setting(values: dict[str, Any]) -> str:
    return f"batch {values['max_batch_size']}, max wait {values['max_wait_ms']:g} ms, {values['clients']} clients"


def panel(server: Any, batch_size: int = 8, max_wait_ms: int = 20, clients: int = 8, max_tokens: int = 8,
          measure_now: bool = True, min_rounds: int | None = None, max_rounds: int | None = None):
    """The ipywidgets panel. ``server``: a running ``launch.start_server`` handle (in this process).

    Returns at once; ``box.measurer.wait()`` blocks until the pending points are measured."""
    import ipywidgets as w

    min_rounds = min_rounds or config.pick(4, 3)
    max_rounds = max_rounds or config.pick(12, 6)
    batch = w.IntSlider(value=batch_size, min=1, max=MAX_BATCH, description="batch size", continuous_update=False)
    wait = w.IntSlider(value=max_wait_ms, min=0, max=200, step=10, description="max wait (ms)",
                       continuous_update=False, style={"description_width": "initial"})
    users = w.IntSlider(value=clients, min=1, max=MAX_CLIENTS, description="clients", continuous_update=False)
    bar = w.IntProgress(value=0, min=0, max=clients, description="idle", bar_style="info")
    status = w.HTML()
    fig = make_figure()
    state = PanelState()
    ui = threading.Lock()  # widget updates come from the worker and from slider callbacks
    warm: dict[str, Any] = {"done": not measure_now, "burst_s": None}

    def burst_note() -> str:  # the measured warm-up burst: what a test's deadline is derived from
        return f" <small>warm-up burst: {warm['burst_s']:.2f} s</small>" if warm["burst_s"] is not None else ""

    def so_far(values: dict[str, Any], point: dict[str, Any]) -> None:
        """After each round: requests done, the point so far and its spread, circled on the plot (not yet a curve)."""
        tps = point.get("output_tokens_per_s")
        with ui:
            status.value = (f"<i>measuring {_setting(values)}: round {point['rounds']}, {point['requests']} requests "
                            "done" + (f"; {tps:.1f} tokens/s so far" if tps is not None else "")
                            + (f", spread {point['spread']:.0%}" if point["rounds"] > 1 and point["spread"] is not None
                               else "") + "</i>" + burst_note())
            if tps is not None:
                with fig.batch_update():
                    fig.data[2].x, fig.data[2].y = [values["max_batch_size"]], [tps]
                    fig.layout.title.text = describe(point) + " (so far)"

    def progress(done: int, total: int) -> None:
        with ui:
            bar.max, bar.value = max(total, 1), min(done, total)

    def measure(values: dict[str, Any], superseded: Callable[[], bool]) -> dict[str, Any]:
        if not warm["done"]:
            # one untimed burst first: a fresh server's first batch pays allocation and kernel
            # set-up, which would make the first point look slower than any later one
            with ui:
                bar.description, status.value = "warming up", "<i>one untimed burst first…</i>"
            t0 = timing.clock()
            measure_point(server, max_tokens=2, superseded=superseded, **values)
            warm["done"], warm["burst_s"] = True, timing.clock() - t0
        return on_change(state, fig, values, lambda **v: measure_point(
            server, max_tokens=max_tokens, progress=progress, rounds=min_rounds, max_rounds=max_rounds,
            superseded=superseded, on_round=lambda point: so_far(values, point), **v))

    def on_event(kind: str, values: dict[str, Any], detail: Any) -> None:
        with ui:
            if kind == "start":
                bar.value, bar.description, bar.bar_style = 0, "measuring", "warning"
                status.value = f"<i>measuring {_setting(values)}…</i> (the kernel stays free)" + burst_note()
            elif kind == "done":
                p = detail
                bar.description, bar.bar_style = "done", "success"
                status.value = (f"{p['rounds']} rounds, {p['requests']} requests in {p['duration_s']:.1f} s, "
                                f"{p['failed']} failed; TTFT p50 {p['ttft_p50_s']:.2f} s" + burst_note())
            elif kind == "superseded":
                status.value = f"<i>{_setting(values)} dropped: a newer setting is measured instead</i>"
            elif kind == "error":
                bar.description, bar.bar_style = "failed", "danger"
                status.value = (f"<b>measurement failed</b> ({_setting(values)}): "
                                f"{type(detail).__name__}: {detail}")
                box.errors.append(f"{type(detail).__name__}: {detail}")

    measurer = Measurer(measure, on_event)

    def update(_change: Any = None) -> None:
        values = {"max_batch_size": batch.value, "max_wait_ms": wait.value, "clients": users.value}
        busy = measurer.busy
        measurer.request(values)
        if busy:
            with ui:
                status.value = f"<i>next: {_setting(values)} (after the current round)</i>"

    for control in (batch, wait, users):
        control.observe(update, names="value")
    box = w.VBox([w.HBox([batch, wait, users]), w.HBox([bar, status]), fig])
    # for tests and scripts: the points, the figure, the sliders, the worker, errors shown so far
    box.state, box.figure, box.controls, box.measurer, box.errors, box.warm = (
        state, fig, {"batch": batch, "wait": wait, "clients": users}, measurer, [], warm)
    if measure_now:
        update()
    return box
