# Solutions to notebook 06's exercises (run with `python -m tools.run_notebooks --only 06 --solutions`).

# %% exercise 06.left_pad
import torch


def left_pad(prompt_ids, pad_id, device):
    """Token-id lists of different lengths → (B, T) input_ids and attention_mask on ``device``."""
    longest = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompt_ids), longest), dtype=torch.long)
    for i, p in enumerate(prompt_ids):
        ids[i, longest - len(p):] = torch.tensor(p, dtype=torch.long)  # real tokens end in the last column
        mask[i, longest - len(p):] = 1
    return ids.to(device), mask.to(device)  # built on the host, one copy each to the model's device


# %% exercise 06.step_inputs
import torch


def step_inputs(attention_mask):
    """(B, T) mask after the prompt → the step's (B, T + 1) mask and the (B,) positions of the new tokens."""
    grown = torch.cat([attention_mask, attention_mask.new_ones(attention_mask.shape[0], 1)], dim=1)
    return grown, attention_mask.sum(-1)  # n real tokens so far: the new one sits at position n
