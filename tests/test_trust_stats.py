"""The bootstrap interval for a difference of medians (core/verdict) and the divergence finder (decoding/quality)."""
import random

import pytest
import torch

from labkit.core import verdict
from labkit.decoding import quality


def test_bootstrap_interval_holds_zero_for_one_population_and_not_for_a_shift():
    rng = random.Random(1)
    a = [rng.gauss(100, 5) for _ in range(40)]
    same = [rng.gauss(100, 5) for _ in range(40)]
    slower = [x * 1.10 for x in same]  # a 10 % slowdown of known size
    lo, hi = verdict.bootstrap_diff(same, a)
    assert lo < 0 < hi, (lo, hi)
    lo, hi = verdict.bootstrap_diff(slower, a)
    assert 0 < lo < 10 < hi < 20, (lo, hi)  # the true shift (about 10) lies inside, zero outside


def test_bootstrap_is_seeded_and_narrows_with_level():
    a, b = [1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 3.0, 4.0, 5.0, 6.0]
    assert verdict.bootstrap_diff(a, b, seed=3) == verdict.bootstrap_diff(a, b, seed=3)
    lo95, hi95 = verdict.bootstrap_diff(a, b, level=0.95)
    lo50, hi50 = verdict.bootstrap_diff(a, b, level=0.50)
    assert lo95 <= lo50 <= hi50 <= hi95


@pytest.mark.parametrize("kwargs, word", [({"resamples": 0}, "resamples"), ({"level": 95}, "level")])
def test_bootstrap_bad_input_names_the_fix(kwargs, word):
    with pytest.raises(ValueError, match=word):
        verdict.bootstrap_diff([1.0, 2.0], [1.0, 2.0], **kwargs)
    with pytest.raises(ValueError, match="each side"):
        verdict.bootstrap_diff([], [1.0])


def test_divergence_position_and_logits_up_to_it():
    a, b = [5, 6, 7, 8], [5, 6, 9, 8]
    la = [torch.tensor([0.0, 1.0]), torch.tensor([0.5, 2.0]), torch.tensor([1.0, 1.0]), torch.tensor([9.0, 0.0])]
    lb = [torch.tensor([0.0, 1.0]), torch.tensor([0.5, 2.25]), torch.tensor([1.5, 1.0]), torch.tensor([0.0, 0.0])]
    d = quality.divergence(a, b, la, lb)
    assert d.position == 2 and d.steps == 3  # step 3's logits read different tokens: left out
    assert d.max_logit_diff == pytest.approx(0.5)
    same = quality.divergence(a, a, la, la)
    assert same.position is None and same.max_logit_diff == 0.0 and same.steps == 4
    lists = quality.divergence([1, 2], [1, 3], [[0.0, 1.0], [2.0, 0.0]], [[0.0, 1.25], [0.0, 0.0]])
    assert lists.position == 1 and lists.max_logit_diff == pytest.approx(2.0)
    assert quality.divergence([1, 2], [1]).position == 1  # a shorter answer parts where it ends
    with pytest.raises(ValueError, match="size"):
        quality.divergence([1], [1], [[0.0, 1.0]], [[0.0]])
