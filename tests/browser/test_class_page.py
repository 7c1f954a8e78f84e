"""The class page an instructor projects: three learners' packs made from this machine's real results
(`make run` wrote them), merged, opened in chromium with the network blocked; every plot draws."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import screenshot_path

pytestmark = pytest.mark.browser
from tools import merge_results
from labkit.core import config

NEEDED = ("01_hardware_sizing", "02_fp16_bf16", "03_int8_int4", "06_batching")
# speeds and bandwidths scaled per learner, as if measured on other laptops
SCALED = ("bandwidth_gbs", "median_gbs", "measured_tokens_per_s", "ceiling_tokens_per_s", "decode_tokens_per_s",
          "total_tokens_per_s", "output_tokens_per_s")
LEARNERS = {"ana": 1.0, "ben": 0.55, "chen": 1.8}


def _as_learner(data: dict, learner: str, scale: float) -> dict:
    data = json.loads(json.dumps(data))
    data["env"].setdefault("hardware", {})["cpu"] = f"{learner}'s laptop"
    for row in data["rows"]:
        for key in SCALED:
            if isinstance(row.get(key), (int, float)) and not isinstance(row[key], bool):
                row[key] *= scale
    return data


def test_class_page_plots_render_offline(tmp_path: Path, offline_page) -> None:
    rdir = config.results_dir()
    missing = [n for n in NEEDED if not (rdir / f"{n}.json").is_file()]
    assert not missing, f"no results for {missing} in {rdir}: run `make run` first (make test does)"
    inbox = tmp_path / "inbox"
    for learner, scale in LEARNERS.items():
        folder = tmp_path / learner / "results"
        folder.mkdir(parents=True)
        for name in NEEDED:
            data = json.loads((rdir / f"{name}.json").read_text(encoding="utf-8"))
            (folder / f"{name}.json").write_text(json.dumps(_as_learner(data, learner, scale)), encoding="utf-8")
        merge_results.pack(learner, folder, inbox)
    out = tmp_path / "class"
    assert merge_results.main(["merge", str(inbox), "--out", str(out)]) == 0
    page = offline_page
    page.set_viewport_size({"width": 1280, "height": 900})
    page.goto((out / "index.html").resolve().as_uri())
    plots = page.locator(".js-plotly-plot")
    plots.first.wait_for(timeout=30_000)
    _, drawn = merge_results.plots_html(merge_results.collect([inbox])[0])
    assert all(drawn.values()), f"every plot should have points from this run's results: {drawn}"
    assert plots.count() == len(merge_results.PLOTS)
    for anchor, *_ in merge_results.PLOTS:
        plot = page.locator(f"section#{anchor} .js-plotly-plot")
        assert plot.locator(".main-svg").count() > 0, f"{anchor}: no SVG drawn"
        marks = plot.locator("g.trace path, g.trace .point, g.trace .bars path").count()
        assert marks > 0, f"{anchor}: axes but no data marks"
        box = plot.bounding_box()
        assert box and box["width"] > 400 and box["height"] > 300, f"{anchor}: too small to project: {box}"
    # one measured point per learner on the roofline plot, the roofline itself drawn
    roof = page.locator("section#roofline .js-plotly-plot").evaluate(
        "el => el.data.map(t => [t.name, Array.from(t.x || []).length])")
    measured = sum(n for name, n in roof if name.startswith("measured"))
    assert measured == len(LEARNERS) and any(name.startswith("roofline") for name, _ in roof), roof
    page.screenshot(path=str(screenshot_path("class-page")), full_page=True)
    assert not page.errors, f"script errors on the class page: {page.errors}"
    assert not page.network.blocked, f"the class page tried the network: {page.network.blocked}"
