# Typical wrong answers to notebook 06's exercises: each check must call them wrong, with a reason.

# %% exercise 06.left_pad
import torch


def left_pad(prompt_ids, pad_id, device):
    # pads on the right, as a tokenizer does by default
    longest = max(len(p) for p in prompt_ids)
    ids = torch.tensor([p + [pad_id] * (longest - len(p)) for p in prompt_ids], device=device)
    mask = torch.tensor([[1] * len(p) + [0] * (longest - len(p)) for p in prompt_ids], device=device)
    return ids, mask


# %% exercise 06.left_pad
import torch


def left_pad(prompt_ids, pad_id, device):
    # right values, but built on the default device whatever the model's device is
    longest = max(len(p) for p in prompt_ids)
    ids = torch.tensor([[pad_id] * (longest - len(p)) + p for p in prompt_ids])
    mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompt_ids])
    return ids, mask


# %% exercise 06.step_inputs
import torch


def step_inputs(attention_mask):
    # the column index as position: wrong for every padded row
    batch, width = attention_mask.shape
    grown = torch.cat([attention_mask, attention_mask.new_ones(batch, 1)], dim=1)
    return grown, torch.full((batch,), width, device=attention_mask.device)


# %% exercise 06.step_inputs
import torch


def step_inputs(attention_mask):
    # forgets to grow the mask
    return attention_mask, attention_mask.sum(-1)
