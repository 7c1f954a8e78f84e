# Typical wrong answers to notebook 10's exercises: each must be called wrong, with a reason.

# %% exercise 10.accept
def accept(draft, predicted):  # forgets the model's own token after the accepted prefix
    n = 0
    while n < len(draft) and draft[n] == predicted[n]:
        n += 1
    return list(draft[:n])


# %% exercise 10.accept
def accept(draft, predicted):  # keeps every matching draft token, even after a disagreement
    kept = [d for d, p in zip(draft, predicted) if d == p]
    return kept + [predicted[len(draft)]]


# %% exercise 10.reusable_prefix
def reusable_prefix(cached, prompt, block):  # not aligned to whole blocks
    n = 0
    while n < min(len(cached), len(prompt) - 1) and cached[n] == prompt[n]:
        n += 1
    return n


# %% exercise 10.reusable_prefix
def reusable_prefix(cached, prompt, block):  # leaves no prompt token to prefill
    n = 0
    while n < min(len(cached), len(prompt)) and cached[n] == prompt[n]:
        n += 1
    return n // block * block


# %% exercise 10.quantize_kv
import torch


def quantize_kv(x):  # one scale per token instead of per channel
    scale = x.abs().amax(dim=-1, keepdim=True).clamp_min(1e-8) / 127
    return (x / scale).round().clamp(-127, 127).to(torch.int8), scale


# %% exercise 10.quantize_kv
import torch


def quantize_kv(x):  # divides by 255: uses half of int8's range
    scale = x.abs().amax(dim=-2, keepdim=True).clamp_min(1e-8) / 255
    return (x / scale).round().clamp(-127, 127).to(torch.int8), scale


# %% exercise 10.reusable_prefix
def reusable_prefix(cached, prompt, block):  # counts matching positions anywhere, not a shared prefix
    limit = min(len(cached), len(prompt) - 1)
    n = sum(cached[i] == prompt[i] for i in range(limit))
    return n // block * block


# %% exercise 10.quantize_kv
import torch


def quantize_kv(x):  # truncates toward zero instead of rounding to the nearest code
    scale = x.abs().amax(dim=-2, keepdim=True).clamp_min(1e-8) / 127
    return (x / scale).trunc().clamp(-127, 127).to(torch.int8), scale
