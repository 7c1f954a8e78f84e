"""Notebook 03's FP8/FP4 sections: the four-corner split of NVFP4 against MXFP4, the formats table, the per-layer
errors, the 4-bit winner judged on KL per prompt, and the GEMM table; every sentence follows its numbers."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

from labkit.core import config, results
from labkit.lessons.nb03b import findings as f03
from labkit.model import sizing
from labkit.precision import formats, fp8_gemm


def _us(x, load=(1.0, 1.08, 0.95, 1.12, 0.9, 1.03)):
    """µs per call in six rounds, each round's load shared by every variant timed in it."""
    return [x * f for f in load]


def _w(seed=0):
    return torch.randn(32, 128, generator=torch.Generator().manual_seed(seed))


def test_the_split_has_the_two_standards_at_their_corners():
    w = _w()
    split = f03.fp4_split(w)
    assert split.loc[(16, "E4M3 + tensor scale"), "standard"] == "nvfp4"
    assert split.loc[(32, "power of two (E8M0)"), "standard"] == "mxfp4"
    assert split.loc[(16, "E4M3 + tensor scale"), "weight_error"] == pytest.approx(formats.relative_error(w, "nvfp4"))
    assert split.loc[(32, "power of two (E8M0)"), "weight_error"] == pytest.approx(formats.relative_error(w, "mxfp4"))
    assert split.loc[(32, "power of two (E8M0)"), "bits_per_weight"] == 4.25


def _split(p2_16, e4_16, p2_32, e4_32):
    idx = pd.MultiIndex.from_tuples([(16, "power of two (E8M0)"), (16, "E4M3 + tensor scale"),
                                     (32, "power of two (E8M0)"), (32, "E4M3 + tensor scale")], names=["block", "scale"])
    return pd.DataFrame({"weight_error": [p2_16, e4_16, p2_32, e4_32]}, index=idx)


def test_the_split_sentence_names_the_difference_that_pays():
    assert "comes from the E4M3 scale" in f03.split_sentence(_split(0.117, 0.094, 0.116, 0.100))
    assert "comes from the smaller block" in f03.split_sentence(_split(0.080, 0.078, 0.116, 0.110))
    said = f03.split_sentence(_split(0.117, 0.094, 0.116, 0.100))
    assert f"{0.116 / 0.100:.2f}×" in said and f"{0.116 / 0.117:.2f}×" in said


def _row(v, kl, per_prompt=None, **kw):
    return {"variant": v, "status": "ok", "kl": kl, "kl_per_prompt": per_prompt or [kl], "agreement": 0.5,
            "perplexity": 10.0, "weight_bytes": 100, "predicted_weight_bytes": 100, **kw}


def test_the_formats_table_orders_eight_bits_then_four_and_takes_bits_from_sizing():
    shape = sizing.shape("default")
    rows = [_row("nvfp4", 0.3), _row("fp32", 0.0), _row("mxfp4", 0.7), _row("fp8-channel", 0.02),
            {"variant": "bnb-nf4", "status": "cannot run here: no bitsandbytes"}]
    t = f03.formats_table(rows, shape)
    assert list(t.index) == ["fp32", "fp8-channel", "nvfp4", "mxfp4"]  # a row that did not run is left out
    assert t.bits_per_weight["mxfp4"] == sizing.bits_per_weight(shape, "mxfp4") == pytest.approx(4.25)
    assert t.bits_per_weight["fp32"] == 32


def test_the_closest_4bit_row_is_named_only_when_its_kl_is_really_lower():
    shape = sizing.shape("default")
    clear = [_row("nvfp4", 0.3, [0.30, 0.31, 0.29, 0.30]), _row("mxfp4", 0.7, [0.70, 0.71, 0.69, 0.70])]
    assert f03.closest_4bit(clear, f03.formats_table(clear, shape)) == ("nvfp4", "")
    close = [_row("nvfp4", 0.3, [0.1, 0.5]), _row("mxfp4", 0.32, [0.5, 0.14])]
    winner, why = f03.closest_4bit(close, f03.formats_table(close, shape))
    assert winner is None and "nvfp4 and mxfp4" in why


def test_layer_errors_read_the_rows_and_the_sentence_counts_them():
    errs = {"nvfp4": [0.09, 0.10], "mxfp4": [0.12, 0.09]}
    rows = [{"variant": v, "status": "ok", "layer_errors": [
        {"layer": f"model.layers.{i}.mlp.down_proj", "relative_error": e} for i, e in enumerate(es)]} for v, es in errs.items()]
    layers = f03.layer_errors(rows, ["nvfp4", "mxfp4"])
    assert len(layers) == 4 and set(layers.kind) == {"down_proj"} and sorted(set(layers["index"])) == [0, 1]
    said = f03.layer_sentence(layers)
    assert "above nvfp4's in 1 of 2 layers" in said
    assert "No per-layer errors" in f03.layer_sentence(layers[layers.variant == "nvfp4"])


def test_the_gemm_table_and_takeaways_follow_the_rows():
    us = {"fp32": _us(10.0), "bf16": _us(9.1), "fp8_upcast": _us(205.0), "fp8_scaled_mm": _us(300.0)}
    gemm = [{"what": "up", **fp8_gemm.gemm_row(1, 64, 32, us)}]
    t = f03.gemm_table(gemm)
    assert list(t.variant) == ["fp32", "bf16", "fp8_upcast", "fp8_scaled_mm"]
    assert t.set_index("variant").verdict["fp8_scaled_mm"] == "worse"
    hand = pd.DataFrame({"output_error": [0.0, 0.006, 0.016]}, index=["fp32", "int8 per-channel", "fp8 per-channel"])
    rows = [_row("fp32", 0.0), _row("nvfp4", 0.3)]
    found = f03.takeaways(hand=hand, fmt_table=f03.formats_table(rows, sizing.shape("default")), rows=rows,
                                  split=None, layers=None, gemm=gemm)
    assert any("fp8_scaled_mm 0.03× (worse)" in s for s in found.sentences)
    assert found.rows[-1]["finding"].startswith("fp8 _scaled_mm") and found.rows[-1]["verdict"] == "worse"
    assert any(f"{0.016 / 0.006:.2f}× int8 per-channel's" in s and "finer" in s for s in found.sentences)
    assert found.headline["label"].startswith("KL against fp32 of the lowest-KL 4-bit row (nvfp4)")


def test_the_gpu_sentence_reads_the_saved_h200_run_and_says_it_is_not_this_run():
    h200 = results.load(config.DATA_DIR / "measured_gpu" / "fp8_gemm.nvidia-h200.json")
    said = f03.gpu_gemm_sentence(h200)
    big = max(h200.section("gemm"), key=lambda r: r["M"] * r["K"] * r["N"])
    assert "NVIDIA H200" in said and "not this run" in said and "2026-12-04" in said
    assert f"{big['M']}×{big['K']}×{big['N']} {big['speedup_vs_bf16']['fp8_scaled_mm']:.2f}×" in said
    assert "1 sample a cell, judged unpaired, recorded 2026-12-04, so no verdict on any of them" in said
    assert "within noise" not in said and f03.judged_how(h200) == "judged unpaired, recorded 2026-12-04"
    # the recorded rows: three small shapes at 25-37 µs in every precision (a launch), one memory-bound shape
    assert "fixed cost: 1×4096×4096" in said and "256×4096×4096" in said.split("fixed cost:")[1]
    assert "memory-bound: 16×8192×28672 1.18×" in said and "compute-bound: 4096×4096×4096 1.67×" in said
    flat = results.Results.from_dict(h200.to_dict())
    for r in flat.section("gemm"):
        r["speedup_vs_bf16"]["fp8_scaled_mm"] = 0.5  # never faster: no claim that FP8 pays
    assert "FP8 pays" not in f03.gpu_gemm_sentence(flat)


def test_a_saved_gpu_run_in_paired_rounds_is_judged_paired():
    """A GPU run saved with paired rounds (the bench's rows say ``paired``) is judged round by round and says so; the
    same samples recorded without it are judged by the unpaired rule, with the date it was recorded."""
    load = (1.0, 1.3, 0.8, 1.2, 0.9, 1.1)
    rows = [fp8_gemm.gemm_row(4096, 4096, 4096, {"bf16": _us(100.0, load), "fp8_scaled_mm": _us(92.0, load)})]
    env = {"date": "2026-12-07T10:00:00", "hardware": {"gpu": "NVIDIA H200"}}
    paired = results.Results("fp8_gemm", env=env, rows=[dict(r, section="gemm") for r in rows])
    said = f03.gpu_gemm_sentence(paired)
    assert "judged paired" in said and "4096×4096×4096 1.09× (faster)" in said and f03.judged_how(paired) == "judged paired"
    old = results.Results("fp8_gemm", env=env, rows=[dict(r, section="gemm", paired=False) for r in rows])
    said = f03.gpu_gemm_sentence(old)
    assert "judged unpaired, recorded 2026-12-07" in said and "(faster)" not in said and "within noise" in said
    assert f03.gemm_table(old.section("gemm"), base="bf16").set_index("variant").verdict["fp8_scaled_mm"] == "within noise"
    assert f03.gemm_table(paired.section("gemm"), base="bf16").set_index("variant").verdict["fp8_scaled_mm"] == "better"


def test_the_gemm_takeaway_names_where_it_ran_and_explains_only_a_slower_fp8_on_a_cpu():
    gemm = [{"what": "up", **fp8_gemm.gemm_row(1, 64, 32, {"fp32": _us(10.0), "fp8_scaled_mm": _us(4.0)})}]
    hand = pd.DataFrame({"output_error": [0.0, 0.006, 0.016]}, index=["fp32", "int8 per-channel", "fp8 per-channel"])
    rows = [_row("fp32", 0.0)]
    table = f03.formats_table(rows, sizing.shape("default"))
    gpu = f03.takeaways(hand=hand, fmt_table=table, rows=rows, split=None, layers=None, gemm=gemm, gemm_on="NVIDIA H200")
    said = next(s for s in gpu.sentences if "decode step's GEMM" in s)
    why = "each FP8 weight is converted to fp32"
    assert "NVIDIA H200" in said and why not in said

    def cpu_said(g):
        return next(s for s in f03.takeaways(hand=hand, fmt_table=table, rows=rows, split=None, layers=None,
                                             gemm=g).sentences if "decode step's GEMM" in s)

    assert "this CPU" in cpu_said(gemm) and why not in cpu_said(gemm)  # FP8 won here: no story of why it lost
    slow = [{"what": "up", **fp8_gemm.gemm_row(1, 64, 32, {"fp32": _us(10.0), "fp8_scaled_mm": _us(40.0)})}]
    assert "Every FP8 variant was slower" in cpu_said(slow) and why in cpu_said(slow)
