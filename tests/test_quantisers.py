"""labkit.precision.quantisers: fake int8 rounding and clipping, per-channel against per-tensor scales, and the
hand-written int8 and NF4 quantisers giving ONNX Runtime's and bitsandbytes' own values."""
from __future__ import annotations

import pytest
import torch

from labkit.core import env
from labkit.precision import libraries, quantisers


def test_fake_int8_rounds_and_clips():
    import torch

    x = torch.tensor([0.0, 0.26, -0.74, 20.0, -30.0])
    assert quantisers.fake_int8(x, 0.5).tolist() == [0.0, 0.5, -0.5, 20.0, -30.0]
    assert quantisers.fake_int8(x, 0.1).tolist() == pytest.approx([0.0, 0.3, -0.7, 12.7, -12.7])  # ±127 steps at most
    rows = torch.tensor([[0.0, 0.0], [1.0, -2.0]])
    q = quantisers.fake_int8(rows, rows.abs().amax(-1, keepdim=True) / 127)  # per-row scales, one of them 0
    assert q[0].tolist() == [0.0, 0.0] and q[1, 1] == -2.0 and not q.isnan().any()


def test_per_channel_scales_keep_small_rows_that_per_tensor_scales_erase():
    w = torch.tensor([[0.001, -0.002, 0.003], [100.0, -50.0, 25.0]])
    per_tensor = quantisers.fake_quant_weight(w, per_channel=False, reduce_range=False)
    per_channel = quantisers.fake_quant_weight(w, per_channel=True, reduce_range=False)
    assert torch.equal(per_tensor[0], torch.zeros(3))  # the small row rounds to 0 with the big row's scale
    assert torch.allclose(per_channel[0], w[0], rtol=0.01)
    x = torch.linspace(-3, 5, 200)
    xq = quantisers.fake_quant_activation(x)
    assert (xq - x).abs().max() <= (8 / 255) / 2 + 1e-6  # half a uint8 step of the range


def _weight() -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(64, 128, generator=gen) * torch.linspace(0.01, 1.0, 64)[:, None]  # rows: a multiple of 32, as NF4 repacking needs


def test_hand_written_int8_is_onnx_runtimes_int8():
    w = _weight()
    for per_channel in (False, True):
        for reduce_range in (False, True):
            qmax = 64 if reduce_range else 127
            q, w_hat = quantisers.int8_round_trip(w, quantisers.absmax_scale(w, per_channel, qmax), qmax)
            oq, oscale = libraries.ort_quantized_weight(w, per_channel, reduce_range)
            assert oq.dtype == torch.int8 and torch.equal(q, oq)
            assert torch.allclose(oscale, quantisers.absmax_scale(w, per_channel, qmax))
            assert w_hat.dtype == torch.float32 and (w_hat - w).abs().max() <= oscale.max() / 2 + 1e-7


def test_hand_written_int8_and_nf4_are_bitsandbytes_own():
    if not env.capability("bitsandbytes").available:
        pytest.skip(env.capability("bitsandbytes").reason)
    import bitsandbytes.functional as F

    w = _weight()
    cb, scb, _ = F.int8_vectorwise_quant(w.half())
    w16 = w.half().float()
    q, _ = quantisers.int8_round_trip(w16, quantisers.absmax_scale(w16, per_channel=True))
    assert (q != cb).float().mean() < 1e-3  # equal but for values on a rounding tie (w/s vs w·(127/absmax))
    code = F.get_4bit_type("nf4", device="cpu")
    assert torch.allclose(code, torch.tensor(quantisers.NF4_CODE))
    idx, amax = quantisers.nf4_quantize(w.reshape(-1, 64), code)
    packed, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4")
    assert torch.equal((code[idx] * amax).reshape(w.shape), F.dequantize_4bit(packed, state))
