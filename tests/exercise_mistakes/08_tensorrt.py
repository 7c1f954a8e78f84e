# Typical wrong answers to notebook 08's exercises: each must be called "wrong", with a reason.

# %% exercise 08.rms_norm
import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * weight  # eps outside the root


# %% exercise 08.rms_norm
import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)  # the weight is forgotten


# %% exercise 08.rms_norm
import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, eps=eps)  # LayerNorm subtracts the mean


# %% exercise 08.norm_traffic
def norm_traffic(rows: int, hidden: int, bytes_per_value: int) -> tuple[int, int]:
    return 4 * rows * hidden * bytes_per_value, rows * hidden * bytes_per_value  # writes only


# %% exercise 08.norm_traffic
def norm_traffic(rows: int, hidden: int, bytes_per_value: int) -> tuple[int, int]:
    return 7 * rows * hidden, 2 * rows * hidden  # values, not bytes
