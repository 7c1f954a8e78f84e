"""Plotly figures that render offline: plotly.js is embedded in the notebook, never fetched."""
from __future__ import annotations

from typing import Any

from ..model.roofline import ridge_intensity

_TEMPLATE = "plotly_white"


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
    if facet:
        fig.update_yaxes(matches=None, showticklabels=True)
        fig.update_xaxes(matches=None)
    return fig


def line(df: Any, x: str, y: str | list[str], title: str, x_title: str, y_title: str,
         color: str | None = None, log_x: bool = False, log_y: bool = False, markers: bool = True):
    import plotly.express as px

    fig = px.line(df, x=x, y=y, color=color, title=title, markers=markers, log_x=log_x, log_y=log_y)
    fig.update_layout(xaxis_title=x_title, yaxis_title=y_title, template=_TEMPLATE)
    return fig


def scatter(df: Any, x: str, y: str, title: str, x_title: str, y_title: str, text: str | None = None,
            color: str | None = None):
    import plotly.express as px

    fig = px.scatter(df, x=x, y=y, text=text, color=color, title=title)
    if text:
        fig.update_traces(textposition="top center")
    fig.update_layout(xaxis_title=x_title, yaxis_title=y_title, template=_TEMPLATE)
    return fig


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
