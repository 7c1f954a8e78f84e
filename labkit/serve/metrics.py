"""Prometheus metrics, written and read: the lab's server's histograms (batch size, queue wait, TTFT, end-to-end
latency), counters and gauges, exported in the text format ``/metrics`` serves, updated from the event loop and
the model thread; and the one reader of anyone's ``/metrics`` (the lab's, vLLM's, the router's): ``scrape``,
``parse_prometheus``, ``metric_totals`` (one number per name), ``metric_info`` and ``metrics_delta`` (what a
measurement added).
"""
from __future__ import annotations

import re
import threading
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# -------------------------------------------------------------------------------------------- metrics

LATENCY_BUCKETS_S = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


@dataclass
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.n += 1
        self.total += value
        for i, edge in enumerate(self.buckets):
            if value <= edge:
                self.counts[i] += 1  # per bucket; render() makes them cumulative
                break

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for edge, count in zip(self.buckets, self.counts):
            running += count
            lines.append(f'{self.name}_bucket{{le="{edge:g}"}} {running}')
        lines += [f'{self.name}_bucket{{le="+Inf"}} {self.n}', f"{self.name}_sum {self.total:.6f}",
                  f"{self.name}_count {self.n}"]
        return lines


class Metrics:
    """Counters, gauges and histograms, updated from the event loop and the model thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.batches = 0
        self.batch_size = Histogram("labkit_batch_size", "Sequences per batch the model ran", BATCH_BUCKETS)
        self.queue_wait = Histogram("labkit_queue_wait_seconds", "Time from arrival to the start of its batch",
                                    LATENCY_BUCKETS_S)
        self.ttft = Histogram("labkit_time_to_first_token_seconds", "Arrival to first token, server side",
                              LATENCY_BUCKETS_S)
        self.e2e = Histogram("labkit_e2e_request_latency_seconds", "Arrival to last token, server side",
                             LATENCY_BUCKETS_S)

    def count(self, endpoint: str, status: int) -> None:
        with self.lock:
            self.requests[(endpoint, status)] = self.requests.get((endpoint, status), 0) + 1

    def observe(self, hist: Histogram, value: float) -> None:
        with self.lock:
            hist.observe(value)

    def add_tokens(self, prompt: int = 0, output: int = 0) -> None:
        with self.lock:
            self.prompt_tokens += prompt
            self.output_tokens += output

    def reset(self) -> None:
        """Fresh counters and histograms, in place: every thread keeps writing to this one object."""
        fresh = Metrics()
        with self.lock:
            for name, value in vars(fresh).items():
                if name != "lock":
                    setattr(self, name, value)

    def snapshot(self) -> dict[str, Any]:
        """Plain numbers for notebooks: request counts, mean batch size, tokens."""
        with self.lock:
            return {"requests": {f"{e} {s}": n for (e, s), n in sorted(self.requests.items())},
                    "batches": self.batch_size.n,
                    "mean_batch_size": self.batch_size.total / self.batch_size.n if self.batch_size.n else None,
                    "sequences_batched": self.batch_size.total,
                    "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens}

    def render(self, gauges: dict[str, tuple[str, float]], counters: dict[str, tuple[str, float]] | None = None) -> str:
        with self.lock:
            lines = ["# HELP labkit_requests_total Requests answered, by endpoint and HTTP status",
                     "# TYPE labkit_requests_total counter"]
            lines += [f'labkit_requests_total{{endpoint="{e}",status="{s}"}} {n}'
                      for (e, s), n in sorted(self.requests.items())]
            for name, help_text, value in (("labkit_prompt_tokens_total", "Prompt tokens admitted", self.prompt_tokens),
                                           ("labkit_generation_tokens_total", "Tokens generated", self.output_tokens)):
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {value}"]
            for name, (help_text, value) in (counters or {}).items():
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {value:g}"]
            for name, (help_text, value) in gauges.items():
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value:g}"]
            for hist in (self.batch_size, self.queue_wait, self.ttft, self.e2e):
                lines += hist.render()
        return "\n".join(lines) + "\n"


def mean_batch_between(before: Mapping[str, Any], after: Mapping[str, Any]) -> float | None:
    """The mean batch size of what ran between two ``snapshot()``s: (sequences after − before) / (batches after −
    before). Snapshots taken around a measured run leave out whatever ran before it (a load generator's warm-up
    request, an earlier experiment), which a mean over the server's whole life would count; None when no batch
    ran in between."""
    batches = after["batches"] - before["batches"]
    if batches < 0:
        raise ValueError("the 'after' snapshot has fewer batches than 'before': the server's metrics were reset "
                         "in between; take both snapshots around one run")
    return (after["sequences_batched"] - before["sequences_batched"]) / batches if batches else None


# ---------------------------------------------------------------------------------------- reading anyone's /metrics

_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format: one ``(name, labels, value)`` per sample line; comments skipped."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


def metric_totals(samples: Sequence[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    """One number per metric name, summed over label sets (models, engines, finish reasons); histogram
    buckets left out (their ``_sum`` and ``_count`` stay)."""
    totals: dict[str, float] = {}
    for name, _labels, value in samples:
        if not name.endswith("_bucket"):
            totals[name] = totals.get(name, 0.0) + value
    return totals


def metric_info(samples: Sequence[tuple[str, dict[str, str], float]], name: str) -> dict[str, str]:
    """The labels of an info metric, e.g. ``vllm:cache_config_info`` (block_size, num_gpu_blocks, ...)."""
    return next((labels for n, labels, _v in samples if n == name), {})


_CUMULATIVE = ("_total", "_sum", "_count", "_created")


def metrics_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """What a measurement added: counters and histogram sums/counts as after − before, gauges as after."""
    return {name: value - before.get(name, 0.0) if name.endswith(_CUMULATIVE) else value
            for name, value in after.items() if not name.endswith("_created")}


def samples_delta(before: Sequence[tuple[str, dict[str, str], float]],
                  after: Sequence[tuple[str, dict[str, str], float]]) -> list[tuple[str, dict[str, str], float]]:
    """``scrape``'s samples of one measurement alone: every counter and histogram bucket, sum and count as after −
    before (a warm-up answered before ``before`` is left out), every gauge as after."""
    was = {(name, tuple(sorted(labels.items()))): value for name, labels, value in before}
    return [(name, labels, value - was.get((name, tuple(sorted(labels.items()))), 0.0)
             if name.endswith((*_CUMULATIVE, "_bucket")) else value) for name, labels, value in after]


def scrape(url: str, timeout_s: float = 5.0) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of the ``/metrics`` a server at ``url`` serves (the lab's, vLLM's, the router's)."""
    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=timeout_s) as resp:  # 127.0.0.1 only
        return parse_prometheus(resp.read().decode("utf-8"))


def totals(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """``scrape`` as one number per metric name (``metric_totals``)."""
    return metric_totals(scrape(url, timeout_s))


def histogram(samples: Sequence[tuple[str, dict[str, str], float]], name: str) -> dict[str, Any]:
    """One histogram from ``scrape``'s samples (or ``samples_delta``'s), summed over label sets: ``count``, ``sum``
    and ``buckets``, the cumulative counts as ``(upper edge, count)`` pairs in edge order (``+Inf`` last)."""
    edges: dict[float, float] = {}
    count = total = 0.0
    for n, labels, value in samples:
        if n == f"{name}_bucket":
            le = float("inf") if labels.get("le") == "+Inf" else float(labels["le"])
            edges[le] = edges.get(le, 0.0) + value
        elif n == f"{name}_count":
            count += value
        elif n == f"{name}_sum":
            total += value
    if not edges:
        raise ValueError(f"no histogram {name!r} among the samples: is it the server's name for it (see /metrics)?")
    return {"count": count, "sum": total, "buckets": sorted(edges.items())}


def histogram_quantile(hist: Mapping[str, Any], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a ``histogram``, as Prometheus's ``histogram_quantile`` estimates it: linear within
    the bucket it falls in (a histogram knows no more), the lower edge of the first bucket taken as 0; None when empty.
    A quantile in the ``+Inf`` bucket is the last finite edge."""
    if not 0 <= q <= 1:
        raise ValueError(f"q={q}: a quantile lies in [0, 1]")
    buckets = hist["buckets"]
    n = buckets[-1][1] if buckets else 0.0
    if n <= 0:
        return None
    rank, lo_edge, lo_count = q * n, 0.0, 0.0
    for edge, count in buckets:
        if count >= rank:
            if edge == float("inf"):
                return lo_edge
            return lo_edge + (edge - lo_edge) * ((rank - lo_count) / (count - lo_count) if count > lo_count else 0.0)
        lo_edge, lo_count = edge, count
    return lo_edge


def bucket_of(hist: Mapping[str, Any], value: float) -> tuple[float, float]:
    """The histogram's bucket ``(lower edge, upper edge]`` that holds ``value``: how finely it can place a figure."""
    lo = 0.0
    for edge, _count in hist["buckets"]:
        if value <= edge:
            return lo, edge
        lo = edge
    return lo, float("inf")
