# Typical wrong answers to notebook 04's exercises: each check must call them wrong, with a reason.

# %% exercise 04.calls_until_settled
from labkit.engines.warmup import window_spread


def calls_until_settled(latencies_s, until_spread, window):
    # counts the steady window in
    for end in range(window, len(latencies_s) + 1):
        if window_spread(latencies_s[end - window:end]) < until_spread:
            return end
    return None


# %% exercise 04.calls_until_settled
import statistics


def calls_until_settled(latencies_s, until_spread, window):
    # its own spread: (max - min) / median
    for start in range(len(latencies_s) - window + 1):
        part = latencies_s[start:start + window]
        if (max(part) - min(part)) / statistics.median(part) < until_spread:
            return start
    return None


# %% exercise 04.calls_until_settled
from labkit.engines.warmup import window_spread


def calls_until_settled(latencies_s, until_spread, window):
    # says 0 when it never settles
    for start in range(len(latencies_s) - window + 1):
        if window_spread(latencies_s[start:start + window]) < until_spread:
            return start
    return 0


# %% exercise 04.one_time_share
import statistics


def one_time_share(latencies_s, window):
    # divides by the steady latency: a slowdown, not a share
    steady = statistics.median(latencies_s[-window:])
    return (latencies_s[0] - steady) / steady


# %% exercise 04.one_time_share
def one_time_share(latencies_s, window):
    # takes the second call as steady
    return (latencies_s[0] - latencies_s[1]) / latencies_s[0]


# %% exercise 04.calls_until_settled
def calls_until_settled(latencies_s, until_spread, window):
    # says None (never settles) unless the very first window settles
    from labkit.engines.warmup import window_spread
    return 0 if window_spread(latencies_s[:window]) < until_spread else None
