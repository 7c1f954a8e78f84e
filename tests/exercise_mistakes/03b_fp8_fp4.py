# Typical wrong answers to notebook 03b's exercises: each check must call them wrong, with a reason.

# %% exercise 03.e4m3_round
import torch


def e4m3_round(x):
    # no saturation: 500 rounds to 512
    a = x.abs()
    e = torch.floor(torch.log2(a.clamp_min(2.0 ** -9))).clamp_min(-6)
    step = torch.exp2(e - 3)
    return torch.copysign(torch.round(a / step) * step, x)


# %% exercise 03.e4m3_round
import torch


def e4m3_round(x):
    # no subnormals: the step keeps shrinking below 2^-6
    a = x.abs().clamp(max=448.0)
    step = torch.exp2(torch.floor(torch.log2(a.clamp_min(2.0 ** -30))) - 3)
    return torch.copysign((torch.round(a / step) * step).clamp(max=448.0), x)


# %% exercise 03.e4m3_round
import torch


def e4m3_round(x):
    # ties away from zero instead of to even
    a = x.abs().clamp(max=448.0)
    e = torch.floor(torch.log2(a.clamp_min(2.0 ** -9))).clamp_min(-6)
    step = torch.exp2(e - 3)
    return torch.copysign((torch.floor(a / step + 0.5) * step).clamp(max=448.0), x)


# %% exercise 03.e4m3_round
import torch


def e4m3_round(x):
    # two mantissa bits (E5M2's step) in E4M3's range
    a = x.abs().clamp(max=448.0)
    e = torch.floor(torch.log2(a.clamp_min(2.0 ** -9))).clamp_min(-6)
    step = torch.exp2(e - 2)
    return torch.copysign((torch.round(a / step) * step).clamp(max=448.0), x)


# %% exercise 03.e4m3_round
import torch


def e4m3_round(x):
    # torch's own cast: the reference, not an answer
    return x.to(torch.float8_e4m3fn).float()


# %% exercise 03.nvfp4_quantize
import torch
from labkit.precision.formats import round_e2m1


def nvfp4_quantize(w):
    # the block scale kept in fp32, never rounded to E4M3
    blocks = w.reshape(w.shape[0], -1, 16)
    scale = blocks.abs().amax(dim=-1, keepdim=True) / 6
    return (round_e2m1(torch.where(scale > 0, blocks / scale.clamp_min(1e-30), 0.0)) * scale).reshape(w.shape)


# %% exercise 03.nvfp4_quantize
import torch
from labkit.precision.formats import round_e2m1, round_e4m3


def nvfp4_quantize(w):
    # a zero block divides 0 by 0
    ts = w.abs().max() / (448 * 6)
    blocks = w.reshape(w.shape[0], -1, 16)
    scale = round_e4m3(blocks.abs().amax(dim=-1, keepdim=True) / 6 / ts) * ts
    return (round_e2m1(blocks / scale) * scale).reshape(w.shape)


# %% exercise 03.nvfp4_quantize
import torch
from labkit.precision.formats import round_e2m1, round_e4m3


def nvfp4_quantize(w):
    # blocks of 32
    ts = w.abs().max() / (448 * 6)
    blocks = w.reshape(w.shape[0], -1, 32)
    scale = round_e4m3(blocks.abs().amax(dim=-1, keepdim=True) / 6 / ts) * ts
    return (round_e2m1(torch.where(scale > 0, blocks / scale.clamp_min(1e-30), 0.0)) * scale).reshape(w.shape)


# %% exercise 03.mxfp4_quantize
import torch
from labkit.precision.formats import round_e2m1


def mxfp4_quantize(w):
    # absmax / 6: not a power of two
    blocks = w.reshape(w.shape[0], -1, 32)
    scale = blocks.abs().amax(dim=-1, keepdim=True) / 6
    return (round_e2m1(torch.where(scale > 0, blocks / scale.clamp_min(1e-30), 0.0)) * scale).reshape(w.shape)


# %% exercise 03.mxfp4_quantize
import torch
from labkit.precision.formats import round_e2m1


def mxfp4_quantize(w):
    # forgets E2M1's own exponent: the absmax lands in [1, 2)
    blocks = w.reshape(w.shape[0], -1, 32)
    scale = torch.exp2(torch.floor(torch.log2(blocks.abs().amax(dim=-1, keepdim=True).clamp_min(1e-30))))
    return (round_e2m1(blocks / scale) * scale).reshape(w.shape)


# %% exercise 03.mxfp4_quantize
import torch
from labkit.precision.formats import round_e2m1


def mxfp4_quantize(w):
    # a zero block: log2(0) is -inf, and 0 × inf is NaN
    blocks = w.reshape(w.shape[0], -1, 32)
    scale = torch.exp2(torch.floor(torch.log2(blocks.abs().amax(dim=-1, keepdim=True))) - 2)
    return (round_e2m1(blocks / scale) * scale).reshape(w.shape)
