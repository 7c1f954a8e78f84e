"""Plotly figures that render offline: plotly.js is embedded in the notebook, never fetched."""
from __future__ import annotations

import re
from typing import Any

from ..model.roofline import ridge_intensity

_TEMPLATE = "plotly_white"
# a results column's words that read better as an acronym or a unit
_WORDS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E", "kv": "KV", "rss": "RSS", "gpu": "GPU",
          "cpu": "CPU", "kl": "KL", "slo": "SLO", "ort": "ORT", "usd": "USD", "mib": "MiB", "gib": "GiB",
          "gbs": "GB/s", "gflops": "GFLOP/s", "rps": "req/s", "us": "µs"}
_UNITS = {"s", "ms", "us", "mib", "gib", "gbs", "bytes", "rps", "gflops", "usd"}


def readable(name: Any) -> Any:
    """A results column's name as a legend or a table header says it: ``decode_tokens_per_s`` → "decode tokens/s",
    ``ttft_p50_s`` → "TTFT p50 (s)", ``weight_MiB`` → "weight (MiB)". Anything but a lower-case identifier with an
    underscore (a label such as "fp16" or "Llama-3.1-8B · batch 1") comes back as it is."""
    if not isinstance(name, str) or "_" not in name or not re.fullmatch(r"[A-Za-z0-9]+(_[A-Za-z0-9]+)+", name):
        return name
    words = name.split("_")
    unit = words.pop() if words[-1].lower() in _UNITS and words[-2:-1] != ["per"] else None
    out: list[str] = []
    for w in words:
        if w == "s" and out and out[-1] == "per":  # tokens per s → tokens/s
            out[-2:] = [out[-2] + "/s"] if len(out) > 1 else ["/s"]
        else:
            out.append(_WORDS.get(w.lower(), w))
    text = " ".join(out)
    return f"{text} ({_WORDS.get(unit.lower(), unit)})" if unit else text


def _readable_legend(fig: Any, legend_title: str | None) -> Any:
    """Trace names and facet labels in words (a wide frame's columns, a melted "metric"), no "variable" title."""
    fig.for_each_trace(lambda t: t.update(name=readable(t.name)) if t.name else None)
    fig.for_each_annotation(lambda a: a.update(text=readable(a.text.split("=", 1)[-1])) if a.text else None)
    fig.update_layout(legend_title_text=readable(legend_title) if legend_title else "")
    return fig


def setup_offline() -> None:
    """Embed plotly.js in notebook outputs (renderer ``notebook``), so plots work without internet
    and survive ``nbconvert --to slides``; tables show every cell's whole text."""
    import plotly.io as pio

    pio.renderers.default = "notebook"
    pio.templates.default = _TEMPLATE
    import pandas as pd

    pd.set_option("display.max_colwidth", None)  # a capability's reason is read whole, not cut at 50 characters


def bar(df: Any, x: str, y: str, title: str, y_title: str, color: str | None = None, text_auto: bool | str = ".3g",
        facet: str | None = None):
    """Grouped bars; ``facet`` splits them into panels with their own y axes (a reference machine's figures and
    this run's never share one axis)."""
    import plotly.express as px

    fig = px.bar(df, x=x, y=y, color=color, title=title, text_auto=text_auto, barmode="group", facet_col=facet)
    fig.update_layout(yaxis_title=y_title, template=_TEMPLATE)
    _readable_legend(fig, color)
    if facet:
        fig.update_yaxes(matches=None, showticklabels=True)
        fig.update_xaxes(matches=None)
    return fig


def line(df: Any, x: str, y: str | list[str], title: str, x_title: str, y_title: str,
         color: str | None = None, log_x: bool = False, log_y: bool = False, markers: bool = True):
    import plotly.express as px

    fig = px.line(df, x=x, y=y, color=color, title=title, markers=markers, log_x=log_x, log_y=log_y)
    fig.update_layout(xaxis_title=x_title, yaxis_title=y_title, template=_TEMPLATE)
    return _readable_legend(fig, color)


def scatter(df: Any, x: str, y: str, title: str, x_title: str, y_title: str, text: str | None = None,
            color: str | None = None):
    import plotly.express as px

    fig = px.scatter(df, x=x, y=y, text=text, color=color, title=title)
    if text:
        fig.update_traces(textposition="top center")
    fig.update_layout(xaxis_title=x_title, yaxis_title=y_title, template=_TEMPLATE)
    return _readable_legend(fig, color)


def predicted_vs_measured(labels: list[str], predicted: list[float], measured: list[float], title: str, unit: str):
    """Side-by-side bars of a prediction and its measurement, with the ratio as text."""
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_bar(name="predicted", x=labels, y=predicted)
    ratios = [f"{m / p:.2f}× of predicted" if p else "" for p, m in zip(predicted, measured)]
    fig.add_bar(name="measured", x=labels, y=measured, text=ratios, textposition="outside")
    fig.update_layout(title=title, yaxis_title=unit, barmode="group", template=_TEMPLATE)
    return fig


def roofline(bandwidth_gbs: float, peak_gflops: float, points: Any, title: str):
    """The two roofs on log axes — bandwidth × intensity (slope) and the matmul peak (flat) — and measured
    points: ``points`` has columns ``label``, ``intensity`` (FLOPs per byte) and ``gflops`` (achieved)."""
    import numpy as np
    import plotly.graph_objects as go

    ridge = ridge_intensity(bandwidth_gbs, peak_gflops)
    lo = min([ridge, *points["intensity"]]) / 4
    hi = max([ridge, *points["intensity"]]) * 4
    xs = np.geomspace(lo, hi, 64)
    fig = go.Figure()
    fig.add_scatter(x=xs, y=np.minimum(bandwidth_gbs * xs, peak_gflops), mode="lines", name="roof (this run's probes)",
                    line={"color": "black"})
    fig.add_scatter(x=[ridge], y=[peak_gflops], mode="markers+text", name="ridge", text=[f"ridge {ridge:.3g} FLOP/B"],
                    textposition="top left", marker={"color": "black", "symbol": "diamond"})
    fig.add_scatter(x=list(points["intensity"]), y=list(points["gflops"]), mode="markers+text", name="measured",
                    text=list(points["label"]), textposition="bottom right", marker={"size": 10})
    fig.update_layout(title=title, xaxis_title="arithmetic intensity (FLOPs per byte moved)",
                      yaxis_title="GFLOP/s", xaxis_type="log", yaxis_type="log", template=_TEMPLATE)
    return fig
