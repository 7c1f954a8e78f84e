"""The price table's provenance and the cost arithmetic (labkit.lessons.cost, data/prices.json)."""
from __future__ import annotations

import copy
import datetime as dt
import json

import pandas as pd
import pytest

from labkit.lessons import cost

GOOD = {"name": "Example 1x GPU", "kind": "gpu", "gpus": 1, "hourly_usd": 2.0,
        "source": "https://example.com/pricing", "date": "2026-01-15"}


def write(tmp_path, rows):
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"prices": rows}), encoding="utf-8")
    return path


def test_the_shipped_table_has_provenance_on_every_row():
    rows = cost.load_prices()
    assert len(rows) >= 10 and {r["kind"] for r in rows} == {"gpu", "cpu"}
    for r in rows:
        assert r["source"].startswith("https://") and r["hourly_usd"] > 0, r
        assert dt.date.fromisoformat(r["date"]) <= dt.date.today(), r  # read or published, so not in the future
        assert r.get("date_meaning"), f"{r['name']}: say whether the date is when the price was read or published"
    assert len({r["name"] for r in rows}) == len(rows)


def test_every_cpu_row_has_vcpus_and_both_architectures_are_priced():
    cpu = [r for r in cost.load_prices() if r["kind"] == "cpu"]
    for r in cpu:
        assert isinstance(r.get("vcpus"), int) and r["vcpus"] > 0, r["name"]
        assert r["arch"] in ("x86", "arm"), r["name"]
    assert {r["arch"] for r in cpu} == {"x86", "arm"}, "the table needs at least one x86 and one Arm CPU row"


@pytest.mark.parametrize("arch", [None, "amd64", "ARM"])
def test_a_cpu_row_without_a_known_arch_fails_naming_the_fix(tmp_path, arch):
    row = {**GOOD, "name": "Example CPU", "kind": "cpu", "gpus": None}
    if arch is not None:
        row["arch"] = arch
    with pytest.raises(ValueError, match=rf"row 0 \('Example CPU'\): arch={arch!r}: .*add \"arch\": one of"):
        cost.load_prices(write(tmp_path, [row]))
    cost.load_prices(write(tmp_path, [{**row, "arch": "x86"}]))  # the fix named in the error is enough


@pytest.mark.parametrize("field", ["source", "date"])
def test_a_row_without_its_source_or_date_fails_naming_the_row(tmp_path, field):
    bad = {k: v for k, v in GOOD.items() if k != field}
    bad["name"] = "Unsourced 1x GPU"
    with pytest.raises(ValueError, match=rf"row 1 \('Unsourced 1x GPU'\): {field}=None"):
        cost.load_prices(write(tmp_path, [GOOD, bad]))


@pytest.mark.parametrize("change, match", [
    ({"source": "pricing page"}, "URL of the page"),
    ({"date": "15/01/2026"}, "YYYY-MM-DD"),
    ({"date": "2026-13-01"}, "YYYY-MM-DD"),
    ({"kind": "tpu"}, "choose one of"),
    ({"hourly_usd": 0}, "hourly_usd=0"),
    ({"hourly_usd": "2.0"}, "positive number"),
    ({"hourly_usd": True}, "positive number"),
    ({"gpus": 0}, "gpus=0"),
    ({"name": ""}, "no name"),
])
def test_every_field_is_checked(tmp_path, change, match):
    with pytest.raises(ValueError, match=match):
        cost.load_prices(write(tmp_path, [{**GOOD, **change}]))


def test_file_level_problems_say_what_to_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="no price table"):
        cost.load_prices(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="at least one row"):
        cost.load_prices(write(tmp_path, []))
    with pytest.raises(ValueError, match="same name twice"):
        cost.load_prices(write(tmp_path, [GOOD, copy.deepcopy(GOOD)]))
    broken = tmp_path / "broken.json"
    broken.write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match="not valid JSON"):
        cost.load_prices(broken)


def test_dollars_per_million_tokens():
    # $3.60 an hour at 1000 tokens/s: 3.6 M tokens an hour, so $1 per million
    assert cost.usd_per_million_tokens(1000, 3.6) == pytest.approx(1.0)
    assert cost.usd_per_million_tokens(20, 0.0816) == pytest.approx(0.0816 / (20 * 3600) * 1e6)
    assert cost.usd_per_million_tokens(2000, 3.6) == pytest.approx(cost.usd_per_million_tokens(1000, 3.6) / 2)
    for bad in ((0, 1.0), (10, 0), (-5, 1.0), (10, float("nan"))):
        with pytest.raises(ValueError, match="positive number"):
            cost.usd_per_million_tokens(*bad)


def test_cost_table_scales_gpu_rows_and_keeps_provenance():
    prices = [GOOD, {**GOOD, "name": "Example 8x GPU", "gpus": 8, "hourly_usd": 20.0},
              {**GOOD, "name": "Example CPU", "kind": "cpu", "arch": "x86", "gpus": None, "hourly_usd": 0.1}]
    table = cost.cost_table(100.0, prices)
    by = table.set_index("name")
    assert by.loc["Example 8x GPU", "tokens_per_s"] == 800.0 and by.loc["Example CPU", "tokens_per_s"] == 100.0
    assert by.loc["Example 8x GPU", "usd_per_million_tokens"] == pytest.approx(20.0 / (800 * 3600) * 1e6)
    assert by.loc["Example 1x GPU", "usd_per_million_tokens"] == pytest.approx(2.0 / (100 * 3600) * 1e6)
    assert list(table["usd_per_million_tokens"]) == sorted(table["usd_per_million_tokens"])  # cheapest first
    assert set(table["source"]) == {"https://example.com/pricing"}
    unscaled = cost.cost_table(100.0, prices, per_gpu=False).set_index("name")
    assert unscaled.loc["Example 8x GPU", "tokens_per_s"] == 100.0


def test_cost_table_per_kind_throughput_own_price_and_filter():
    prices = [GOOD, {**GOOD, "name": "Example CPU", "kind": "cpu", "arch": "x86", "gpus": None, "hourly_usd": 0.1}]
    table = cost.cost_table({"cpu": 20.0}, prices, hourly_usd=0.05)
    by = table.set_index("name")
    assert by.loc["your price", "usd_per_million_tokens"] == pytest.approx(0.05 / (20 * 3600) * 1e6)
    assert by.loc["your price", "source"] == "set in this notebook"
    assert pd.isna(by.loc["Example 1x GPU", "usd_per_million_tokens"])  # no GPU throughput given: no cost, not 0
    assert table.iloc[-1]["name"] == "Example 1x GPU"
    assert list(cost.cost_table(5.0, prices, kind="cpu")["name"]) == ["Example CPU"]
    with pytest.raises(ValueError, match="kind='tpu'"):
        cost.cost_table(5.0, prices, kind="tpu")
    with pytest.raises(ValueError, match="hourly_usd=-1"):
        cost.cost_table(5.0, prices, hourly_usd=-1)
    with pytest.raises(ValueError, match="source=None"):
        cost.cost_table(5.0, [{k: v for k, v in GOOD.items() if k != "source"}])


def test_cost_table_on_the_shipped_prices():
    table = cost.cost_table({"gpu": 1000.0, "cpu": 20.0})
    rows = {r["name"]: r for r in cost.load_prices()}
    assert len(table) == len(rows)
    for rec in table.to_dict("records"):
        row = rows[rec["name"]]
        tps = (1000.0 * row["gpus"]) if row["kind"] == "gpu" else 20.0
        assert rec["usd_per_million_tokens"] == pytest.approx(row["hourly_usd"] / (tps * 3600) * 1e6)


def test_cpu_rows_are_priced_as_if_each_vcpu_did_one_core_here():
    """The recorded run: one single-thread replica made 37.0 tokens/s at the knee on a 2-core machine."""
    tps, said = cost.cpu_as_if(37.0, 2)
    shipped = {r["name"]: r for r in cost.load_prices()}
    assert tps["your price"] == pytest.approx(74.0) and tps["AWS m7g.large"] == pytest.approx(37.0 * 2)
    assert all(tps[n] == pytest.approx(37.0 * r["vcpus"]) for n, r in shipped.items() if r["kind"] == "cpu")
    assert not any(shipped[n]["kind"] == "gpu" for n in tps if n in shipped), "GPU rows get no CPU throughput"
    assert said.startswith("Priced as if") and "74.0 tokens/s" in said and "half a core" in said
    table = cost.cost_table(tps, hourly_usd=0.10, label="your price").set_index("name")
    assert table.loc["AWS m7g.large", "usd_per_million_tokens"] == pytest.approx(0.0816 / (74.0 * 3600) * 1e6)
    assert table.loc["your price", "tokens_per_s"] == pytest.approx(74.0)
    with pytest.raises(ValueError, match="cores"):
        cost.cpu_as_if(37.0, 0)
    with pytest.raises(ValueError, match="per_core_tokens_per_s"):
        cost.cpu_as_if(0.0, 2)


def test_the_default_price_row_follows_this_machines_architecture():
    """An x86 laptop was priced as an Arm instance (m7g.large) by default; the default now matches its arch."""
    assert cost.price_for("cpu", "x86") == "AWS m7i.xlarge" and cost.price_for("cpu", "arm") == "AWS m7g.large"
    assert cost.price_for("gpu") == next(r["name"] for r in cost.load_prices() if r["kind"] == "gpu")
    with pytest.raises(ValueError, match="HOURLY_USD"):
        cost.price_for("cpu", "riscv")
