# Typical wrong answers to notebook 03's exercises: each check must call them wrong, with a reason.

# %% exercise 03.per_channel_scale
def per_channel_scale(w):
    # the uint8 range: 255 steps
    return w.abs().amax(dim=1, keepdim=True) / 255


# %% exercise 03.per_channel_scale
def per_channel_scale(w):
    # one scale per column (input feature), not per output row
    return w.abs().amax(dim=0, keepdim=True) / 127


# %% exercise 03.per_channel_scale
def per_channel_scale(w):
    # max, not absmax: a row led by a negative weight gets a small scale
    return w.amax(dim=1, keepdim=True) / 127


# %% exercise 03.int8_round_trip
import torch


def int8_round_trip(w, scale):
    # no clamp: codes past ±127 wrap around in the int8 cast
    q = torch.round(w / scale).to(torch.int8)
    return q, q.float() * scale


# %% exercise 03.int8_round_trip
import torch


def int8_round_trip(w, scale):
    # truncates instead of rounding
    q = (w / scale).clamp(-127, 127).to(torch.int8)
    return q, q.float() * scale


# %% exercise 03.int8_round_trip
import torch


def int8_round_trip(w, scale):
    # forgets to multiply back by the scale
    q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    return q, q.float()


# %% exercise 03.nf4_quantize
def nf4_quantize(blocks, code):
    # matches the raw values to the code, without dividing by the block's absmax
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    return (blocks.unsqueeze(-1) - code).abs().argmin(dim=-1), absmax


# %% exercise 03.nf4_quantize
import torch


def nf4_quantize(blocks, code):
    # a uniform 4-bit grid instead of the NF4 levels
    absmax = blocks.abs().amax(dim=1, keepdim=True)
    return torch.round((blocks / absmax + 1) * 7.5).clamp(0, 15).long(), absmax


# %% exercise 03.nf4_quantize
def nf4_quantize(blocks, code):
    # one absmax for the whole tensor, not one per block
    absmax = blocks.abs().max()
    return ((blocks / absmax).unsqueeze(-1) - code).abs().argmin(dim=-1), absmax
