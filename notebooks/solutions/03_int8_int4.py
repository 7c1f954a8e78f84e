# Solutions to notebook 03's exercises (run with `python -m tools.run_notebooks --only 03 --solutions`).

# %% exercise 03.per_channel_scale
import torch


def per_channel_scale(w: torch.Tensor) -> torch.Tensor:
    """(out, in) weight → (out, 1) absmax int8 scales, one per output row."""
    return w.abs().amax(dim=1, keepdim=True) / 127  # the row's largest magnitude becomes ±127


# %% exercise 03.int8_round_trip
import torch


def int8_round_trip(w: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) weight and its scale(s) → (q, w_hat): int8 codes in [-127, 127], and q × scale."""
    q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    return q, q.float() * scale


# %% exercise 03.nf4_quantize
import torch


def nf4_quantize(blocks: torch.Tensor, code: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(n, 64) values and the 16 NF4 code values → (indices (n, 64), absmax (n, 1))."""
    absmax = blocks.abs().amax(dim=1, keepdim=True)  # one per block
    indices = ((blocks / absmax).unsqueeze(-1) - code).abs().argmin(dim=-1)  # (n, 64, 16) distances → nearest
    return indices, absmax
