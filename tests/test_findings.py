"""labkit.lessons.findings: the batching lesson's findings choose their words by the numbers."""
from __future__ import annotations

import pytest

from labkit.lessons import findings


def _batching_findings(**over):
    sweep = [{"batch_size": 1, "status": "ok", "total_tokens_per_s": 10.0, "tokens_per_s_per_user": 10.0,
              "ttft_s": 0.1, "agreement": 1.0},
             {"batch_size": 8, "status": "ok", "total_tokens_per_s": 50.0, "tokens_per_s_per_user": 6.25,
              "ttft_s": 0.4, "agreement": 1.0}]
    padding = [{"case": "mixed", "wasted_fraction": 0.6, "ttft_s": 2.0, "agreement": 1.0},
               {"case": "bucketed", "wasted_fraction": 0.1, "ttft_s": 1.0, "agreement": 1.0}]
    serving_rows = [{"max_batch_size": 1, "mean_batch_size": 1.0, "output_tokens_per_s": 10.0, "tpot_p50_s": 0.05,
                     "failed": 0},
                    {"max_batch_size": 8, "mean_batch_size": 6.5, "output_tokens_per_s": 40.0, "tpot_p50_s": 0.08,
                     "failed": 0}]
    open_loop = [{"arrivals": "Poisson", "ttft_p90_s": 0.5, "goodput": 1.9},
                 {"arrivals": "bursty", "ttft_p90_s": 1.5, "goodput": 1.2}]
    args = dict(sweep=sweep, memory_bound_gain=7.5, padding=padding, serving=serving_rows, open_loop=open_loop,
                clients=8, request_rate=2.0)
    args.update(over)
    return findings.batching(**args)


def test_batching_findings_choose_their_words_by_the_numbers():
    text = " ".join(_batching_findings().sentences)
    assert "5.0× the total tokens/s" in text and "less than the memory-bound model's 7.5×" in text
    assert "Batching changed no answer" in text and "prefilled 2.0× faster" in text
    assert "4.0× the tokens/s" in text and "1.6× slower" in text and "3.0× Poisson's (worse)" in text
    sweep = [{"batch_size": 1, "status": "ok", "total_tokens_per_s": 10.0, "tokens_per_s_per_user": 10.0,
              "ttft_s": 0.1, "agreement": 1.0},
             {"batch_size": 4, "status": "ok", "total_tokens_per_s": 90.0, "tokens_per_s_per_user": 22.5,
              "ttft_s": 0.1, "agreement": 0.75}]
    text = " ".join(_batching_findings(sweep=sweep, memory_bound_gain=3.9).sentences)
    assert "more than the memory-bound model's 3.9×" in text and "at batch 4 only 75% of the tokens" in text
    with pytest.raises(ValueError, match="two server rows"):
        _batching_findings(serving=[])
