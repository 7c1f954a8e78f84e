# Solutions to notebook 03b's exercises (run with `python -m tools.run_notebooks --only 03b --solutions`).

# %% exercise 03.e4m3_round
import torch


def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """fp32 values → the nearest FP8 E4M3 value of each, as fp32 (ties to even, ±448 at most)."""
    a = x.abs().clamp(max=448.0)  # saturate: E4M3 has no infinity
    e = torch.floor(torch.log2(a.clamp_min(2.0 ** -9))).clamp_min(-6)  # the binade; below 2^-6 the subnormals' step
    step = torch.exp2(e - 3)  # 3 mantissa bits: 8 values per binade
    return torch.copysign((torch.round(a / step) * step).clamp(max=448.0), x)  # torch.round: half to even


# %% exercise 03.nvfp4_quantize
import torch
from labkit.precision.formats import round_e2m1, round_e4m3


def nvfp4_quantize(w: torch.Tensor) -> torch.Tensor:
    """(out, in) fp32 weight → its NVFP4 round trip (out, in): blocks of 16, E4M3 block scales, an fp32 tensor scale."""
    tensor_scale = w.abs().max() / (448 * 6)  # brings every block scale into E4M3's range
    blocks = w.reshape(w.shape[0], -1, 16)  # (out, in / 16, 16)
    block_scale = round_e4m3(blocks.abs().amax(dim=-1, keepdim=True) / 6 / tensor_scale)  # stored as E4M3
    scale = block_scale * tensor_scale
    codes = round_e2m1(torch.where(scale > 0, blocks / scale.clamp_min(1e-30), 0.0))  # a zero block stays zero
    return (codes * scale).reshape(w.shape)


# %% exercise 03.mxfp4_quantize
import torch
from labkit.precision.formats import round_e2m1


def mxfp4_quantize(w: torch.Tensor) -> torch.Tensor:
    """(out, in) fp32 weight → its MXFP4 round trip (out, in): blocks of 32, a power-of-two (E8M0) scale each."""
    blocks = w.reshape(w.shape[0], -1, 32)  # (out, in / 32, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale = torch.exp2(torch.floor(torch.log2(amax.clamp_min(1e-30))) - 2)  # absmax lands in [4, 8); 6 and up clip
    return (round_e2m1(blocks / scale) * scale).reshape(w.shape)
