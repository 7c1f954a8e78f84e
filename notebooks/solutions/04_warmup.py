# Solutions to notebook 04's exercises (run with `python -m tools.run_notebooks --only 04 --solutions`).

# %% exercise 04.calls_until_settled
from labkit.engines.warmup import window_spread


def calls_until_settled(latencies_s, until_spread, window):
    """Calls before the first `window` calls in a row whose spread is under `until_spread`; None if none."""
    for start in range(len(latencies_s) - window + 1):
        if window_spread(latencies_s[start:start + window]) < until_spread:
            return start  # the calls before the steady window are the warmup
    return None


# %% exercise 04.one_time_share
import statistics


def one_time_share(latencies_s, window):
    """(first − steady) / first, steady being the median of the last `window` latencies."""
    steady = statistics.median(latencies_s[-window:])
    return (latencies_s[0] - steady) / latencies_s[0]
