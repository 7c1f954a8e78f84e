import pandas as pd

from labkit.lessons import plots


def test_roofline_draws_both_roofs_and_every_point():
    points = pd.DataFrame({"label": ["decode", "prefill"], "intensity": [0.5, 40.0], "gflops": [2.0, 30.0]})
    fig = plots.roofline(bandwidth_gbs=10.0, peak_gflops=100.0, points=points, title="t")
    roof, ridge, measured = fig.data
    assert max(roof.y) == 100.0 and min(roof.y) < 10.0  # the flat and the slope below the ridge
    assert list(ridge.x) == [10.0]
    assert list(measured.x) == [0.5, 40.0] and list(measured.text) == ["decode", "prefill"]
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"


def test_faceted_bars_give_each_machine_its_own_axis():
    df = pd.DataFrame({"engine": ["a", "b", "a"], "tps": [10.0, 20.0, 300.0], "where": ["this run"] * 2 + ["reference"]})
    fig = plots.bar(df, x="engine", y="tps", color="where", title="t", y_title="tokens/s", facet="where")
    axes = [k for k in fig.layout.to_plotly_json() if k.startswith("yaxis")]
    assert len(axes) == 2 and all(fig.layout[k].matches is None for k in axes)
    assert {a.text.split("=")[-1] for a in fig.layout.annotations} == {"this run", "reference"}


def test_no_notebook_puts_a_reference_bar_beside_a_live_bar_on_one_axis():
    import re
    from pathlib import Path

    for src in sorted(Path(__file__).parents[1].joinpath("notebooks", "src").glob("*.py")):
        for call in re.findall(r"plots\.bar\((?:[^()]|\([^()]*\))*\)", src.read_text()):
            if '"where"' in call:
                assert 'facet="where"' in call, f"{src.name}: {call[:80]}… mixes machines on one axis: facet='where'"


def test_legends_and_facets_name_columns_in_words():
    df = pd.DataFrame({"batch_size": [1, 8], "total_tokens_per_s": [10.0, 25.0], "tokens_per_s_per_user": [10.0, 3.1],
                       "where": ["this run", "reference"]})
    fig = plots.line(df, x="batch_size", y=["total_tokens_per_s", "tokens_per_s_per_user"], title="t", x_title="batch",
                     y_title="tokens/s")
    assert [t.name for t in fig.data] == ["total tokens/s", "tokens/s per user"]
    assert fig.layout.legend.title.text == "", "no 'variable' over a wide frame's columns"
    bars = plots.bar(df.melt(id_vars=["where"], value_vars=["total_tokens_per_s"], var_name="metric_name"), x="where",
                     y="value", color="metric_name", title="t", y_title="tokens/s", facet="where")
    assert {t.name for t in bars.data} == {"total tokens/s"} and bars.layout.legend.title.text == "metric name"
    assert {a.text for a in bars.layout.annotations} == {"this run", "reference"}, "facet labels without 'where='"
    assert plots.readable("ttft_p50_s") == "TTFT p50 (s)" and plots.readable("fp16") == "fp16"
