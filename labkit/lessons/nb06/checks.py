"""Checks for notebook 06 (batching): a left-padded batch with its mask, and the next step's mask and positions."""
from __future__ import annotations

from typing import Any

from ..exercises import Wrong, call, close, exercise, follows_device


def _pair(out: Any, what: str) -> tuple[Any, Any]:
    import torch

    if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
        raise Wrong(f"return two tensors, {what}; got {type(out).__name__}")
    return out[0], out[1]


@exercise("06.left_pad", "left padding and its attention mask", hints=(
    "Pad every row to the longest prompt's length, T, with the pads on the left. Each row's last real token "
    "then sits in the last column, so every row's next token lands in the same column. The attention mask has "
    "the same (B, T) shape: 1 marks a real token, 0 a pad.",
    "Token ids are integers: make input_ids torch.long, not a float tensor. Return both tensors on `device`, the "
    "model's device: the check asks for torch's 'meta' device as well, so a tensor left on the CPU is caught.",
    "With `T = max(len(p) for p in prompt_ids)`, start from `ids = torch.full((len(prompt_ids), T), pad_id)` "
    "and a mask of zeros of that shape. Fill row i from the right, `ids[i, T - len(p):] = torch.tensor(p)` and "
    "`mask[i, T - len(p):] = 1`, and end with `.to(device)` on both.",
))
def check_left_pad(fn: Any) -> None:
    import torch

    prompts, pad_id = [[5, 6, 7, 8], [9], [10, 11]], 99
    longest = max(len(p) for p in prompts)
    want_ids = torch.tensor([[pad_id] * (longest - len(p)) + p for p in prompts])
    want_mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
    ids, mask = _pair(call(fn, prompts, pad_id, torch.device("cpu")), "(input_ids, attention_mask)")
    if ids.is_floating_point():
        raise Wrong(f"input ids are {ids.dtype}: token ids are integers (torch.long)", hint=2)
    if tuple(ids.shape) == tuple(want_ids.shape):
        right = torch.tensor([p + [pad_id] * (longest - len(p)) for p in prompts])
        if torch.equal(ids.long(), right):
            raise Wrong("the pads are on the right: put them on the left, so every row's last real token sits in the "
                        "last column and each row's next token lands in the same column", hint=1)
    close(ids.long(), want_ids, "input_ids", hint=1)
    if tuple(mask.shape) == tuple(want_mask.shape) and torch.equal(mask.long(), 1 - want_mask):
        raise Wrong("the mask is inverted: 1 marks a real token the model attends to, 0 a pad it must ignore", hint=1)
    close(mask.long(), want_mask, "attention_mask", hint=1)
    follows_device(lambda: _pair(call(fn, prompts, pad_id, torch.device("meta")), "(input_ids, attention_mask)"),
                   ("input_ids", "attention_mask"),
                   "build the tensors on `device`, or move them there at the end (.to(device))",
                   "asked for device 'meta', {name} came back on {device}: build it on `device` (or .to(device)) — "
                   "the model's device, which is a GPU on a GPU machine", hint=2)


@exercise("06.step_inputs", "next-step mask and positions", hints=(
    "The new token is a real token that every later step attends to, so the step's mask is the old one with "
    "one column of ones appended: (B, T + 1). Its position counts the row's real tokens only, from 0, so "
    "the pads of a left-padded row do not count.",
    "A row with n real tokens puts its next token at position n, not n - 1 and not the column index T. Count "
    "the ones of each row of the mask, and return one position per row, shape (B,), not (B, 1). The check "
    "also passes a mask on torch's 'meta' device: make new tensors on attention_mask.device.",
    "The mask grows by one column of ones on the right: make that column with `attention_mask.new_ones(...)` (same "
    "dtype and device) and join it with `torch.cat` along dim 1. The new token's position is how many real tokens its "
    "row held before it: a sum over the mask's last dimension.",
))
def check_step_inputs(fn: Any) -> None:
    import torch

    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 0, 1, 1], [0, 1, 1, 1, 1]])
    want_mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], dim=1)
    want_pos = mask.sum(-1)  # a row with n real tokens puts its next token at position n (positions start at 0)
    new_mask, pos = _pair(call(fn, mask), "(the step's attention mask, the new tokens' positions)")
    if tuple(new_mask.shape) == tuple(mask.shape):
        raise Wrong("the mask did not grow: append one column of ones, since the new token is a real position that "
                    "every later step attends to", hint=1)
    close(new_mask.long(), want_mask, "the step's attention mask", hint=1)
    if pos.dim() == 2 and pos.shape[1] == 1:
        raise Wrong(f"positions have shape {tuple(pos.shape)}: return one per row, shape (B,)", hint=2)
    if tuple(pos.shape) == tuple(want_pos.shape):
        p = pos.long()
        if torch.all(p == mask.shape[1]):
            raise Wrong(f"every row got position {mask.shape[1]}, the column index: count real tokens instead — "
                        f"row 1 has {int((mask[1] == 0).sum())} pads and {int(mask[1].sum())} real tokens, so its new "
                        f"token sits at position {int(want_pos[1])}", hint=2)
        if torch.equal(p, want_pos - 1):
            raise Wrong("one too small: positions start at 0, so after n real tokens the new token sits at position n",
                        hint=2)
    close(pos.long(), want_pos, "positions", hint=2)
    follows_device(lambda: _pair(call(fn, mask.to("meta")), "(mask, positions)"), ("mask", "positions"),
                   "create new tensors on mask.device (mask.new_ones(...)) and keep the work in tensors",
                   "with the mask on device 'meta', the {name} came back on {device}: create it on mask.device",
                   hint=2)
