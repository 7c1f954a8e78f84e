# Solutions to notebook 14's exercises (run by `python -m tools.run_notebooks --solutions` and tests/test_exercises.py).

# %% exercise 14.align
def align(records):
    """records: one dict per request with "start_s", "first_token_s", "end_s" (one clock, seconds) and "tokens" (the
    server's count of output tokens). Return {"ttft_p50_s", "tpot_p50_s", "output_tokens_per_s"} under one
    definition: TTFT = first token - start; TPOT = (end - first token) / (tokens - 1); tokens over the run's span."""
    import statistics

    ttft = [r["first_token_s"] - r["start_s"] for r in records]
    tpot = [(r["end_s"] - r["first_token_s"]) / (r["tokens"] - 1) for r in records if r["tokens"] > 1]
    span = max(r["end_s"] for r in records) - min(r["start_s"] for r in records)
    return {"ttft_p50_s": statistics.median(ttft), "tpot_p50_s": statistics.median(tpot),
            "output_tokens_per_s": sum(r["tokens"] for r in records) / span}


# %% exercise 14.bootstrap_diff
def bootstrap_diff(new, base, resamples=2000, seed=0):
    """new, base: samples of one quantity (seconds). Return (low, high): a 95 % percentile-bootstrap interval for
    median(new) - median(base), each side resampled with replacement `resamples` times."""
    import random
    import statistics

    rng = random.Random(seed)
    diffs = sorted(statistics.median(rng.choices(new, k=len(new))) - statistics.median(rng.choices(base, k=len(base)))
                   for _ in range(resamples))
    return diffs[int(0.025 * resamples)], diffs[int(0.975 * resamples) - 1]


# %% exercise 14.report
def report(lg, query_id, event, tokens):
    """lg: the mlperf_loadgen module; query_id: the query LoadGen issued; event: "first" (its first token arrived) or
    "done" (its answer is complete, `tokens` output tokens). Tell LoadGen."""
    if event == "first":
        lg.FirstTokenComplete([lg.QuerySampleResponse(query_id, 0, 0)])
    elif event == "done":
        lg.QuerySamplesComplete([lg.QuerySampleResponse(query_id, 0, 0, tokens)])


# %% exercise 14.pairs_needed
def pairs_needed(sigma_d, change):
    """sigma_d: standard deviation of the per-pair log-ratios ln(B_i / A_i) when nothing changed; change: the change
    to catch (0.10 for 10 %). Return the least number of pairs n (never fewer than 6, the fewest a sign-flip test can
    decide on) with n >= (t(0.975, n - 1) + t(0.90, n - 1)) ** 2 * (sigma_d / delta) ** 2, delta = ln(1 + change).
    verdict.t_quantile(q, df) is Student's t quantile (from labkit.core import verdict)."""
    import math

    from labkit.core import verdict

    delta = math.log1p(change)
    n = 2
    while n < (verdict.t_quantile(0.975, n - 1) + verdict.t_quantile(0.90, n - 1)) ** 2 * (sigma_d / delta) ** 2:
        n += 1
    return max(n, 6)
