"""Checks for notebook 02 (fp16 and bf16): a format's largest finite value from its bits, and a running sum kept
in a 16-bit format. ``running_sum`` is labkit's version, which the notebook uses until the learner's is correct."""
from __future__ import annotations

import math
import numbers
from typing import Any

from ..exercises import Wrong, call, exercise


def running_sum(start: float, step: float, n: int, dtype: Any) -> float:
    """``start`` plus ``step``, ``n`` times, the running total rounded to ``dtype`` after every addition."""
    import torch

    total = torch.tensor(start, dtype=dtype, device="cpu")  # number formats: any device rounds the same way
    inc = torch.tensor(step, dtype=dtype, device="cpu")
    for _ in range(n):
        total = total + inc
    return total.item()


def _as_float(got: Any, what: str) -> float:
    import torch

    if isinstance(got, torch.Tensor) and got.numel() == 1:
        return got.item()
    if isinstance(got, bool) or not isinstance(got, numbers.Real):  # numpy scalars (np.float16…) count
        raise Wrong(f"return {what} as a number, got {type(got).__name__}")
    return float(got)


@exercise("02.float_max", "largest finite value from the bits", hints=(
    "The largest finite value pairs the largest usable exponent with the largest significand. The all-ones "
    "exponent pattern is reserved for inf and NaN, so the largest usable pattern is one below it.",
    "With e exponent bits the bias is 2^(e−1) − 1 and the largest usable pattern is 2^e − 2, so the top exponent "
    "is 2^e − 2 − bias. The significand is the implicit leading 1 followed by m fraction bits all set to one, "
    "1.11…1 in binary: 2 − 2^−m, one last-place step below 2.",
    "Three quantities: the bias, `2 ** (e - 1) - 1` for e exponent bits; the largest exponent field that still holds "
    "a number (all ones is inf and NaN, so one less), minus the bias; and the largest significand, 1.m with every "
    "mantissa bit set, which is 2 less one step of the mantissa. The value is the significand times two to that "
    "exponent.",
))
def check_float_max(fn: Any) -> None:
    import torch

    cases = [  # (name, exponent bits, mantissa bits, the value torch knows, when it has the format)
        ("fp16", 5, 10, torch.finfo(torch.float16).max),
        ("bf16", 8, 7, torch.finfo(torch.bfloat16).max),
        ("fp32", 8, 23, torch.finfo(torch.float32).max),
        ("an 8-bit format with 5 exponent bits (fp8 e5m2)", 5, 2, torch.finfo(torch.float8_e5m2).max),
        ("an IEEE-style 8-bit format with 4 exponent and 3 mantissa bits", 4, 3, (2 - 2**-3) * 2.0**7),
    ]
    for what, e, m, want in cases:
        got = _as_float(call(fn, e, m), "the largest value")
        if got == want:
            continue
        bias = 2 ** (e - 1) - 1
        mistakes = {  # the value a slip gives: (why, the hint written for it)
            (2 - 2**-m) * 2.0 ** (bias + 1): (f"the exponent pattern of all ones ({e} ones) is reserved for inf and "
                                              f"NaN: the largest usable exponent is 2^{e} − 2 − bias = {bias}", 1),
            2.0 ** (bias + 1): ("the mantissa's bits are all ones at the maximum, so the significand is just below 2 "
                                f"(2 − 2^−{m}), not 2", 2),
            2.0**bias: (f"the significand at the maximum is 1.111…1 in binary (2 − 2^−{m}), not 1", 2),
            (1 - 2**-m) * 2.0**bias: ("a normal number has an implicit leading 1: the significand is 1 + fraction, "
                                      f"at most 2 − 2^−{m}", 2),
            (2 - 2**-m) * 2.0 ** (bias - 1): (f"the bias is 2^({e}−1) − 1 = {bias}, and the largest exponent pattern "
                                              f"(2^{e} − 2) minus the bias is {bias}", 2),
        }
        for value, (reason, hint) in mistakes.items():
            if value != want and math.isclose(got, value, rel_tol=1e-9):
                raise Wrong(f"for {what}, {got:.6g}: {reason}", hint=hint)
        raise Wrong(f"for {what} ({e} exponent bits, {m} mantissa bits) you gave {got:.6g}, expected {want:.6g}")


@exercise("02.accumulate", "running sum kept in a 16-bit format", hints=(
    "Every addition must round the running total to the format, as a 16-bit accumulator would. Adding exactly and "
    "converting once at the end hides the effect, and so does torch.sum, which accumulates in a wider type inside.",
    "Keep the total as a tensor of the given dtype and add the step to it n times, one addition at a time: "
    "exactly n additions, no more and no fewer. Return the final total as a Python float (.item()).",
    "Keep the running total as a one-element tensor made with `torch.tensor(..., dtype=dtype)`, and the step too; add "
    "the step to the total n times in a plain `for` loop, so that every addition rounds to dtype; return a Python "
    "number with `.item()`.",
))
def check_accumulate(fn: Any) -> None:
    import torch

    cases = [  # steps that are powers of two, exact in every format: only the running total rounds
        ("1.0 plus 2^-12, 5000 times, in fp16", 1.0, 2**-12, 5000, torch.float16),
        ("0.0 plus 2^-8, 3000 times, in bf16", 0.0, 2**-8, 3000, torch.bfloat16),
        ("0.0 plus 2^-12, 300 times, in fp16", 0.0, 2**-12, 300, torch.float16),
        ("1.0 plus 2^-12, 5000 times, in fp32", 1.0, 2**-12, 5000, torch.float32),
    ]
    for what, start, step, n, dtype in cases:
        want = running_sum(start, step, n, dtype)
        got = _as_float(call(fn, start, step, n, dtype), "the final total")
        if got == want:
            continue
        exact = start + step * n
        once = torch.tensor(exact, dtype=dtype, device="cpu").item()  # number formats: host is fine
        if math.isclose(got, once, rel_tol=1e-6) or math.isclose(got, exact, rel_tol=1e-6):
            raise Wrong(f"for {what}, {got:.6g}: that is the exact sum ({exact:.6g}) rounded once at the end (or not "
                        "at all). Keep the running total in the format itself and round after every addition, as a "
                        "loop over torch tensors of that dtype does (torch.sum accumulates in a wider type inside)",
                        hint=1)
        for k in (n - 1, n + 1):
            if got == running_sum(start, step, k, dtype):
                raise Wrong(f"for {what}: {got:.6g} is the total after {k} additions, not {n}", hint=2)
        raise Wrong(f"for {what} you gave {got:.6g}, expected {want:.6g} (the exact sum is {exact:.6g})")
