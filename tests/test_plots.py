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
