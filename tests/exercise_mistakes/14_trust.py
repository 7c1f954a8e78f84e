# Typical wrong answers to notebook 14's exercises: each must be called wrong, with a reason.

# %% exercise 14.align
def align(records):  # GuideLLM's TPOT: the whole latency over every token, the first one included
    import statistics

    span = max(r["end_s"] for r in records) - min(r["start_s"] for r in records)
    return {"ttft_p50_s": statistics.median(r["first_token_s"] - r["start_s"] for r in records),
            "tpot_p50_s": statistics.median((r["end_s"] - r["start_s"]) / r["tokens"] for r in records),
            "output_tokens_per_s": sum(r["tokens"] for r in records) / span}


# %% exercise 14.align
def align(records):  # throughput over the sum of the latencies: requests in flight together are counted twice
    import statistics

    return {"ttft_p50_s": statistics.median(r["first_token_s"] - r["start_s"] for r in records),
            "tpot_p50_s": statistics.median((r["end_s"] - r["first_token_s"]) / (r["tokens"] - 1)
                                            for r in records if r["tokens"] > 1),
            "output_tokens_per_s": sum(r["tokens"] for r in records) / sum(r["end_s"] - r["start_s"]
                                                                         for r in records)}


# %% exercise 14.align
def align(records):  # a one-token answer kept in TPOT: it divides by zero, or counts a 0
    import statistics

    span = max(r["end_s"] for r in records) - min(r["start_s"] for r in records)
    return {"ttft_p50_s": statistics.median(r["first_token_s"] - r["start_s"] for r in records),
            "tpot_p50_s": statistics.median((r["end_s"] - r["first_token_s"]) / max(1, r["tokens"] - 1)
                                            for r in records),
            "output_tokens_per_s": sum(r["tokens"] for r in records) / span}


# %% exercise 14.bootstrap_diff
def bootstrap_diff(new, base, resamples=2000, seed=0):  # drawn without replacement: every resample is the sample
    import random
    import statistics

    rng = random.Random(seed)
    diffs = sorted(statistics.median(rng.sample(new, len(new))) - statistics.median(rng.sample(base, len(base)))
                   for _ in range(resamples))
    return diffs[int(0.025 * resamples)], diffs[int(0.975 * resamples) - 1]


# %% exercise 14.bootstrap_diff
def bootstrap_diff(new, base, resamples=2000, seed=0):  # means: a few slow outliers move the interval off 0
    import random
    import statistics

    rng = random.Random(seed)
    diffs = sorted(statistics.mean(rng.choices(new, k=len(new))) - statistics.mean(rng.choices(base, k=len(base)))
                   for _ in range(resamples))
    return diffs[int(0.025 * resamples)], diffs[int(0.975 * resamples) - 1]


# %% exercise 14.bootstrap_diff
def bootstrap_diff(new, base, resamples=2000, seed=0):  # the whole range of the differences, not the central 95 %
    import random
    import statistics

    rng = random.Random(seed)
    diffs = [statistics.median(rng.choices(new, k=len(new))) - statistics.median(rng.choices(base, k=len(base)))
             for _ in range(resamples)]
    return min(diffs), max(diffs)


# %% exercise 14.report
def report(lg, query_id, event, tokens):  # the whole answer reported at its first token
    if event == "first":
        lg.QuerySamplesComplete([lg.QuerySampleResponse(query_id, 0, 0, tokens)])


# %% exercise 14.report
def report(lg, query_id, event, tokens):  # the completion without its token count: LoadGen cannot compute TPOT
    if event == "first":
        lg.FirstTokenComplete([lg.QuerySampleResponse(query_id, 0, 0)])
    elif event == "done":
        lg.QuerySamplesComplete([lg.QuerySampleResponse(query_id, 0, 0)])


# %% exercise 14.pairs_needed
def pairs_needed(sigma_d, change):  # the normal approximation: it undercounts at small n
    import math

    return max(6, math.ceil(10.5 * (sigma_d / math.log1p(change)) ** 2))


# %% exercise 14.pairs_needed
def pairs_needed(sigma_d, change):  # the change itself for δ, not ln(1 + change)
    from labkit.core import verdict

    n = 2
    while n < (verdict.t_quantile(0.975, n - 1) + verdict.t_quantile(0.90, n - 1)) ** 2 * (sigma_d / change) ** 2:
        n += 1
    return max(n, 6)


# %% exercise 14.pairs_needed
def pairs_needed(sigma_d, change):  # one-sided α: t at 0.95 instead of 0.975
    import math

    from labkit.core import verdict

    n = 2
    while n < (verdict.t_quantile(0.95, n - 1) + verdict.t_quantile(0.90, n - 1)) ** 2 * (sigma_d / math.log1p(change)) ** 2:
        n += 1
    return max(n, 6)
