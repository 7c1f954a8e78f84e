"""labkit.precision.formats: the hand-written E4M3, E5M2 and E2M1 roundings against torch's casts and the E2M1 code
table, MXFP4's and NVFP4's scales on blocks worked by hand, bits per weight, the relative errors of a Gaussian
weight, the per-layer helper; and bench/fp8_gemm.py's rows, saved GPU measurement included."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from labkit.core import results, verdict
from bench import fp8_gemm as fp8_gemm_bench
from labkit.precision import formats, fp8_gemm

REPO = Path(__file__).resolve().parent.parent
H200 = REPO / "data" / "measured_gpu" / "fp8_gemm.nvidia-h200.json"


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where NaN, and the same sign on zeros (−0 is not +0 here)."""
    return (torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())
            and torch.equal(torch.signbit(a), torch.signbit(b)))


def _all_codes(dtype: torch.dtype) -> torch.Tensor:
    """Every finite value of a one-byte float dtype, from its 256 bit patterns."""
    v = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    return v[v.isfinite()]


def _probes(dtype: torch.dtype) -> torch.Tensor:
    """Every code, every midpoint between neighbours (the ties), points a quarter step either side, zeros of both
    signs, values past the top, and log-uniform randoms over the whole range, subnormals included."""
    codes = _all_codes(dtype).unique()
    mids = (codes[1:] + codes[:-1]) / 2
    gaps = (codes[1:] - codes[:-1]) / 4
    top = torch.finfo(dtype).max
    gen = torch.Generator().manual_seed(0)
    rand = torch.exp2(torch.empty(20_000).uniform_(math.log2(torch.finfo(dtype).tiny) - 6, math.log2(top) + 1,
                                                    generator=gen))
    rand = rand * (torch.randint(0, 2, (20_000,), generator=gen) * 2 - 1)
    edge = torch.tensor([0.0, -0.0, top, -top, top * 1.03, top * 1.0625, top * 1.2, 1e6, -1e6])
    return torch.cat([codes, mids, mids + gaps, mids - gaps, rand, edge])


# ---------------------------------------------------------------- the element formats, from their definitions


def test_the_definitions_give_torchs_fp8_formats():
    for element, dtype in ((formats.E4M3, torch.float8_e4m3fn), (formats.E5M2, torch.float8_e5m2)):
        info = torch.finfo(dtype)
        assert (element.bits, element.max, element.min_normal) == (info.bits, info.max, info.smallest_normal)
        assert element.min_subnormal == _all_codes(dtype).abs()[_all_codes(dtype) != 0].min()
    assert formats.E4M3.max == 448 and formats.E2M1.max == 6
    assert formats.E2M1.bits * 2 == torch.float4_e2m1fn_x2.itemsize * 8  # two E2M1 codes per packed byte


def test_hand_e4m3_is_torchs_cast_bit_for_bit():
    x = _probes(torch.float8_e4m3fn)
    assert _same_bits(formats.round_e4m3(x), x.to(torch.float8_e4m3fn).float())
    edge = formats.round_e4m3(torch.tensor([2.0**-9, 2.0**-10, 3 * 2.0**-11, 449.0, 480.0, 1e9, -1e9, -0.0]))
    assert edge[:3].tolist() == [2.0**-9, 0.0, 2.0**-9]  # the smallest subnormal; a tie rounds to even (0)
    assert edge[3:7].tolist() == [448.0, 448.0, 448.0, -448.0] and torch.signbit(edge[7])  # saturates; −0 stays


def test_hand_e5m2_is_torchs_cast_inside_its_range_and_saturates_beyond():
    x = _probes(torch.float8_e5m2)
    inside = x.abs() <= 57344
    assert _same_bits(formats.round_e5m2(x[inside]), x[inside].to(torch.float8_e5m2).float())
    assert formats.round_e5m2(torch.tensor([1e6, -1e6])).tolist() == [57344.0, -57344.0]  # torch's cast: ±inf


def _nearest_code(x: torch.Tensor) -> torch.Tensor:
    """The E2M1 reference from the 16-code table alone: the nearest code, a tie going to the even code."""
    table = torch.tensor(formats.e2m1_code_points())
    dist = (x.unsqueeze(-1).clamp(-6, 6) - table).abs()
    best = dist.min(dim=-1, keepdim=True).values
    tied_even = (dist == best) & (torch.arange(16) % 2 == 0)
    pick = torch.where(tied_even.any(-1), tied_even.float().argmax(-1), dist.argmin(-1))
    value = table[pick]
    return torch.where(value == 0, torch.copysign(torch.zeros_like(x), x), value)


def test_e2m1_code_table_is_the_ocp_grid():
    assert formats.e2m1_code_points()[:8] == [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    assert formats.e2m1_code_points()[8:] == [-v for v in [0, 0.5, 1, 1.5, 2, 3, 4, 6]]


def test_hand_e2m1_is_the_code_table_ties_to_even_and_saturates_at_6():
    x = torch.cat([torch.linspace(-8, 8, 257), torch.randn(5000, generator=torch.Generator().manual_seed(1)) * 3,
                   torch.tensor([0.0, -0.0, 6.5, 7.0, 100.0, float("inf"), -1e9])])
    assert _same_bits(formats.round_e2m1(x), _nearest_code(x))
    ties = formats.round_e2m1(torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0]))
    assert ties.tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0]
    assert formats.round_e2m1(torch.tensor([6.5, 7.0, 100.0, float("inf"), -1e9])).tolist() == [6, 6, 6, 6, -6]


def test_e2m1_matches_torchs_fp4_dtype_where_torch_can_cast_to_it():
    try:
        torch.tensor([1.0, 2.0]).to(torch.float4_e2m1fn_x2)
    except (NotImplementedError, RuntimeError) as exc:
        pytest.skip(f"torch {torch.__version__} has no cast to float4_e2m1fn_x2 ({exc}): the code table is the reference")
    pytest.fail("torch can now cast to float4_e2m1fn_x2: compare round_e2m1 with it here")


# ---------------------------------------------------------------- the block formats, worked by hand


def test_mxfp4_scale_is_a_power_of_two_from_the_block_absmax():
    row = torch.zeros(1, 32)
    row[0, :5] = torch.tensor([3.0, 1.1, 0.2, -0.7, 0.0])  # absmax 3: scale 2^(floor(log2 3) - 2) = 0.5
    q = formats.fake_quant(row, "mxfp4")
    assert q[0, :5].tolist() == [3.0, 1.0, 0.25, -0.75, 0.0]  # x / 0.5 = 6, 2.2, 0.4, −1.4 on the E2M1 grid
    clip = torch.zeros(1, 32)
    clip[0, 0], clip[0, 1] = 7.5, 1.0  # absmax 7.5: scale 1, and 7.5 saturates at 6 (MX's clip)
    assert formats.fake_quant(clip, "mxfp4")[0, :2].tolist() == [6.0, 1.0]


def test_nvfp4_rounds_its_block_scale_to_e4m3():
    w = torch.zeros(1, 32)
    w[0, :3] = torch.tensor([6.0, 2.9, -1.2])  # the tensor's absmax 6: tensor scale 6 / 2688, block scale 448
    w[0, 16] = 0.6  # second block: 0.6 / 6 in tensor-scale units is 44.8, E4M3 keeps 44
    q = formats.fake_quant(w, "nvfp4")
    assert q[0, :3].tolist() == [6.0, 3.0, -1.0]  # block scale × tensor scale = 1: E2M1 itself
    assert q[0, 16].item() == pytest.approx(6 * 44 * 6 / 2688)  # 0.6 / scale = 6.1 saturates to 6


@pytest.mark.parametrize("fmt", sorted(formats.FORMATS))
def test_an_all_zero_block_stays_zero_without_nan(fmt):
    w = torch.randn(4, 64, generator=torch.Generator().manual_seed(2))
    w[1] = 0.0
    w[2, :32] = 0.0
    q = formats.fake_quant(w, fmt)
    assert not q.isnan().any() and (q[1] == 0).all() and (q[2, :32] == 0).all()
    zero = formats.fake_quant(torch.zeros(2, 64), fmt)
    assert not zero.isnan().any() and (zero == 0).all()
    assert formats.relative_error(torch.zeros(2, 64), fmt) == 0.0


def test_fake_quant_keeps_dtype_and_device_and_moves_values():
    w = torch.randn(8, 64, generator=torch.Generator().manual_seed(3)).bfloat16()
    for fmt in formats.FORMATS:
        q = formats.fake_quant(w, fmt)
        assert q.dtype == torch.bfloat16 and q.device == w.device and q.shape == w.shape
        assert not torch.equal(q, w), f"{fmt} left a Gaussian weight unchanged"


def test_bad_input_names_the_fix():
    with pytest.raises(ValueError, match=r"pad the columns with zeros to 64"):
        formats.fake_quant(torch.randn(4, 48), "mxfp4")
    with pytest.raises(ValueError, match=r"w\.float\(\)"):
        formats.fake_quant(torch.ones(4, 32, dtype=torch.int8), "nvfp4")
    with pytest.raises(ValueError, match="reshape it to 2-D"):
        formats.fake_quant(torch.randn(32), "fp8-e4m3-channel")
    with pytest.raises(ValueError, match="choose one of"):
        formats.fake_quant(torch.randn(4, 32), "fp6")
    assert formats.fake_quant(torch.randn(4, 48), "fp8-e4m3-channel").shape == (4, 48)  # no block, no constraint


# ---------------------------------------------------------------- bits and errors


def test_bits_per_weight_follow_the_element_and_scale_widths():
    n, k = 576, 1536
    assert formats.bits_per_weight("fp8-e4m3-channel", shape=(n, k)) == 8 + 32 / k
    assert formats.bits_per_weight("fp8-e4m3-tensor", shape=(n, k)) == 8 + 32 / (n * k)
    assert formats.bits_per_weight("mxfp4") == 4.25
    assert formats.bits_per_weight("mxfp4", block=16) == 4.5
    assert formats.bits_per_weight("nvfp4") == 4.5
    assert formats.bits_per_weight("nvfp4", shape=(n, k)) == 4.5 + 32 / (n * k)
    assert formats.bits_per_weight("int4-g32") == 5.0
    with pytest.raises(ValueError, match="shape=.out, in."):
        formats.bits_per_weight("fp8-e4m3-channel")


def test_gaussian_weight_errors_land_near_the_issues_measurements():
    w = torch.randn(576, 1536, generator=torch.Generator().manual_seed(0))
    err = {f: formats.relative_error(w, f) for f in formats.FORMATS}
    assert err["fp8-e4m3-channel"] == pytest.approx(0.026, abs=0.002)
    assert err["int4-g32"] == pytest.approx(0.097, abs=0.003)
    assert err["mxfp4"] == pytest.approx(0.114, abs=0.004)
    assert err["nvfp4"] == pytest.approx(0.095, abs=0.003)
    assert err["nvfp4"] < err["mxfp4"]  # finer scales on smaller blocks, for a quarter bit more
    assert err["fp8-e4m3-channel"] < err["fp8-e5m2-channel"]  # a mantissa bit beats range for weights
    assert max(err[f] for f in formats.FORMATS if f.startswith("fp8-e4m3")) < min(err["mxfp4"], err["nvfp4"])


class _Tiny(nn.Module):
    def __init__(self, k: int = 64) -> None:
        super().__init__()
        self.up, self.down, self.lm_head = nn.Linear(k, 32), nn.Linear(32, k), nn.Linear(k, 100)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head


def test_quantise_linears_rounds_every_linear_but_lm_head():
    torch.manual_seed(0)
    model = _Tiny()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = formats.quantise_linears(model, "nvfp4")
    assert [r["layer"] for r in rows] == ["up", "down"]
    for name in ("up", "down"):
        w = getattr(model, name).weight
        assert torch.equal(w, formats.fake_quant(before[f"{name}.weight"], "nvfp4"))
        assert torch.equal(getattr(model, name).bias, before[f"{name}.bias"])
    assert torch.equal(model.lm_head.weight, before["lm_head.weight"])
    assert rows[0]["relative_error"] == pytest.approx(formats.relative_error(before["up.weight"], "nvfp4"))
    assert len(formats.quantise_linears(_Tiny(), "mxfp4", include_lm_head=True)) == 3


def test_quantise_linears_checks_every_layer_before_changing_any():
    model = _Tiny(k=48)  # up's input dim 48 is not a multiple of 32; down (in 32) would be fine
    before = model.down.weight.detach().clone()
    with pytest.raises(ValueError, match="layer 'up'"):
        formats.quantise_linears(model, "mxfp4")
    assert torch.equal(model.down.weight, before)


# ---------------------------------------------------------------- bench/fp8_gemm.py and the H200 measurement

LOAD = (1.0, 1.08, 0.95, 1.12, 0.9, 1.03)  # six rounds of a machine whose load moves: every variant of a round shares it
OWN = (1.004, 0.996, 1.0, 1.003, 0.997, 1.0)  # what one sample adds of its own


def _us(x: float, load=LOAD, own=None) -> list[float]:
    """µs per call in rounds: x times the round's load, times the sample's own jitter."""
    return [x * f * g for f, g in zip(load, own or [1.0] * len(load))]



def test_gemm_rows_compute_ratios_and_verdicts_from_the_samples():
    row = fp8_gemm.gemm_row(16, 64, 32, {"fp32": _us(10.5), "bf16": _us(10.4, own=OWN), "fp8_upcast": _us(30.0)})
    assert row["speedup_vs_fp32"] == {"bf16": row["fp32_us"] / row["bf16_us"], "fp8_upcast": row["fp32_us"] / row["fp8_upcast_us"]}
    assert row["speedup_vs_fp32"]["fp8_upcast"] == pytest.approx(10.5 / 30.0)
    assert row["verdict_vs_fp32"]["bf16"]["kind"] == "within noise" and row["verdict_vs_fp32"]["bf16"]["paired"]
    assert row["verdict_vs_fp32"]["fp8_upcast"]["kind"] == "worse" and row["paired"] is True
    assert row["fp32_tflops"] == 2 * 16 * 64 * 32 / row["fp32_us"] / 1e6
    assert "fp8_scaled_mm_us" not in row  # a variant that did not run has no number, never 0


def test_a_decode_sized_gemm_cannot_beat_its_bytes():
    """At M = 1 the weights' bytes bound the gain: fp8 read 5× faster than fp32 is implausible, 3× is not; at
    M = 16 no bound applies."""
    fast = {"fp32": _us(50.5), "bf16": _us(24.5, own=OWN), "fp8_upcast": _us(10.0, own=OWN)}
    row = fp8_gemm.gemm_row(1, 64, 32, fast)
    assert row["verdict_vs_fp32"]["fp8_upcast"]["kind"] == verdict.IMPLAUSIBLE
    assert row["verdict_vs_fp32"]["bf16"]["kind"] == "better"
    row = fp8_gemm.gemm_row(1, 64, 32, {**fast, "fp8_upcast": _us(17.0, own=OWN)})
    assert row["verdict_vs_fp32"]["fp8_upcast"]["kind"] == "better"
    assert fp8_gemm.gemm_row(16, 64, 32, fast)["verdict_vs_fp32"]["fp8_upcast"]["kind"] == "better"


def test_gemm_rows_pair_rounds_and_a_saved_run_keeps_its_unpaired_rule():
    """Each round's load hits every variant alike: fp8 8.6 % faster than fp32 through ±12 % of load is "better"
    paired, while the old rule, on the same samples, sees the ranges overlap; fewer than 6 rounds give no verdict;
    a row that says it is not paired (a saved run) is judged by the unpaired rule, and pair_twins keeps that."""
    us = {"fp32": _us(10.0), "fp8_upcast": _us(10.0 / 1.086, own=OWN)}
    row = fp8_gemm.gemm_row(16, 64, 32, us)
    assert row["verdict_vs_fp32"]["fp8_upcast"]["kind"] == "better" and row["verdict_vs_fp32"]["fp8_upcast"]["paired"]
    old = fp8_gemm.gemm_row(16, 64, 32, us, paired=False)
    assert old["verdict_vs_fp32"]["fp8_upcast"]["kind"] == "within noise" and not old["paired"]
    few = fp8_gemm.gemm_row(16, 64, 32, {k: v[:3] for k, v in us.items()})
    assert verdict.Verdict(**few["verdict_vs_fp32"]["fp8_upcast"]).label == "no verdict (3 pairs)"
    twins = fp8_gemm.pair_twins([dict(old, M=1, K=64, N=32), dict(old, M=1, K=32, N=64)])
    assert all(not t["paired"] and not t["verdict_vs_fp32"]["fp8_upcast"].get("paired") for t in twins)
    twins = fp8_gemm.pair_twins([dict(row, M=1, K=64, N=32), dict(row, M=1, K=32, N=64)])
    assert all(t["paired"] and t["verdict_vs_fp32"]["fp8_upcast"]["paired"] for t in twins)


def test_saved_h200_measurement_keeps_its_provenance():
    res = results.Results.from_dict(json.loads(H200.read_text(encoding="utf-8")))
    e, notes = res.env, res.notes
    assert e["date"] == "2026-12-04" and e["device"] == "cuda" and e["command"] == "python3 .gpu/fp8probe.py"
    assert e["hardware"]["gpu"] == "NVIDIA H200" and e["hardware"]["compute_capability"] == [9, 0]
    assert e["versions"]["torch"] == "2.11.0+cu130"
    assert "CUDA events" in notes["method"] and "50 timed calls" in notes["method"] and "5 warm-up" in notes["method"]
    assert "single run" in notes["note"] and notes["baseline"] == "bf16"
    assert "torch._scaled_mm" in notes["probe_source"]
    assert results.reference_name("fp8_gemm", e) == H200.stem  # where the bench's --save-to writes it


def test_saved_h200_ratios_are_computed_from_its_rows():
    rows = results.Results.from_dict(json.loads(H200.read_text(encoding="utf-8"))).section("gemm")
    assert [(r["M"], r["K"], r["N"]) for r in rows] == [(1, 4096, 4096), (16, 4096, 4096), (256, 4096, 4096),
                                                        (4096, 4096, 4096), (16, 8192, 28672), (8192, 8192, 8192)]
    for r in rows:
        for v in ("fp8_scaled_mm", "fp8_upcast"):
            assert r["speedup_vs_bf16"][v] == r["bf16_us"] / r[f"{v}_us"]
            assert r[f"{v}_tflops"] == 2 * r["M"] * r["K"] * r["N"] / r[f"{v}_us"] / 1e6
        again = fp8_gemm.gemm_row(r["M"], r["K"], r["N"], r["samples"], r["fp8_error"], paired=False)
        assert "paired" not in r and again.pop("paired") is False  # one mean a cell, recorded before paired rounds
        assert {k: again[k] for k in again} == {k: r[k] for k in again}
    big = rows[-1]
    assert big["speedup_vs_bf16"]["fp8_scaled_mm"] > 1 > rows[0]["speedup_vs_bf16"]["fp8_scaled_mm"]


def test_bench_writes_the_same_file_shape(tmp_path, monkeypatch, capsys):
    bench = fp8_gemm_bench
    monkeypatch.setattr(bench, "model_shapes", lambda: [(1, 64, 32, "tiny"), (8, 32, 64, "tiny")])
    monkeypatch.setattr(sys, "argv", ["fp8_gemm.py"])
    assert bench.main(["--quick", "--rounds", "3", "--save-to", str(tmp_path)]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["bench"] == "fp8_gemm" and summary["isa"]["torch_cpu_capability"] and len(summary["rows"]) == 2
    assert set(summary["rows"][0]["verdict_vs_fp32"]) == {"bf16", "int8_upcast", "fp8_upcast", "fp8_scaled_mm"} or \
        summary["fp8_scaled_mm"] != "ran"
    saved = results.Results.from_dict(json.loads(Path(summary["saved"]).read_text(encoding="utf-8")))
    h200 = results.Results.from_dict(json.loads(H200.read_text(encoding="utf-8")))
    assert set(h200.section("gemm")[0]) - {"speedup_vs_fp32", "verdict_vs_fp32"} <= set(saved.section("gemm")[0])
    assert {"method", "variants", "baseline", "note"} <= set(saved.notes) and saved.env["command"]


def test_a_variant_judged_differently_on_two_shapes_names_each_shape():
    from labkit.lessons.nb03b import findings as nb03b

    shapes = [fp8_gemm.gemm_row(1, 64, 32, {"fp32": _us(50.5), "bf16": _us(40.5, own=OWN)}),
              fp8_gemm.gemm_row(1, 32, 64, {"fp32": _us(50.5), "bf16": _us(50.3, own=OWN)})]
    judged = [verdict.Verdict(**r["verdict_vs_fp32"]["bf16"]) for r in shapes]
    said = nb03b.shape_labels(judged, shapes)
    assert said == f"{judged[0].label} at 1×64×32, {judged[1].label} at 1×32×64" and judged[0].label != judged[1].label
    assert nb03b.shape_labels(judged[:1] * 2, shapes) == judged[0].label
