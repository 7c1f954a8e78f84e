# Typical wrong answers to notebook 02's exercises: each check must call them wrong, with a reason.

# %% exercise 02.float_max
def float_max(exponent_bits, mantissa_bits):
    # uses the all-ones exponent, which is reserved for inf and NaN
    bias = 2 ** (exponent_bits - 1) - 1
    return (2 - 2.0**-mantissa_bits) * 2.0 ** (2**exponent_bits - 1 - bias)


# %% exercise 02.float_max
def float_max(exponent_bits, mantissa_bits):
    # forgets the mantissa: a significand of 2
    bias = 2 ** (exponent_bits - 1) - 1
    return 2.0 * 2.0**bias


# %% exercise 02.float_max
def float_max(exponent_bits, mantissa_bits):
    # forgets the implicit leading 1
    bias = 2 ** (exponent_bits - 1) - 1
    return (1 - 2.0**-mantissa_bits) * 2.0**bias


# %% exercise 02.accumulate
def accumulate(start, step, n, dtype):
    # adds exactly, then rounds once at the end
    import torch

    return torch.tensor(start + step * n, dtype=dtype).item()


# %% exercise 02.accumulate
def accumulate(start, step, n, dtype):
    # torch.sum accumulates in a wider type inside: no running total in dtype
    import torch

    return (torch.tensor(start, dtype=dtype) + torch.full((n,), step, dtype=dtype).sum()).item()


# %% exercise 02.accumulate
def accumulate(start, step, n, dtype):
    # one addition too many
    import torch

    total = torch.tensor(start, dtype=dtype)
    for _ in range(n + 1):
        total = total + torch.tensor(step, dtype=dtype)
    return total.item()
