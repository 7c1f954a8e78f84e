# Solutions to notebook 02's exercises (run with `python -m tools.run_notebooks --only 02 --solutions`).

# %% exercise 02.float_max
def float_max(exponent_bits, mantissa_bits):
    """Largest finite value of an IEEE-754-style binary format."""
    bias = 2 ** (exponent_bits - 1) - 1
    top_exponent = (2**exponent_bits - 2) - bias  # all ones is reserved for inf and NaN
    return (2 - 2.0**-mantissa_bits) * 2.0**top_exponent  # significand 1.11…1 in binary


# %% exercise 02.accumulate
import torch


def accumulate(start, step, n, dtype):
    """`start` plus `step`, `n` times, the running total kept in `dtype` (rounded after every addition)."""
    total = torch.tensor(start, dtype=dtype)
    inc = torch.tensor(step, dtype=dtype)
    for _ in range(n):
        total = total + inc  # the sum is rounded to dtype here, every time
    return total.item()
