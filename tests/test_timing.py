import time

import pytest

from labkit.core import timing
from labkit.core.timing import Measurement, measure, percentile


def test_percentile_hand_checked():
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]
    assert percentile(xs, 50) == 3.0
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 5.0
    assert percentile(xs, 10) == pytest.approx(1.4)  # 0.4 of the way from 1 to 2
    assert percentile([10.0, 20.0], 90) == pytest.approx(19.0)


def test_percentile_rejects_bad_input():
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_measurement_statistics_from_values():
    m = Measurement.from_values("x", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], unit="ms")
    assert m.n == 10 and m.median == 5.5 and m.unit == "ms"
    assert m.p10 == pytest.approx(1.9) and m.p90 == pytest.approx(9.1)
    assert m.spread == pytest.approx((9.1 - 1.9) / 5.5)
    assert m.noisy  # spread far above 10 %
    assert m.p99 is None  # too few samples for a 1 % tail
    assert Measurement.from_values("y", list(range(1, 201))).p99 == pytest.approx(198.01)


def test_quiet_measurement_is_not_noisy_and_round_trips():
    m = Measurement.from_values("q", [1.00, 1.01, 0.99, 1.00, 1.02])
    assert not m.noisy
    again = Measurement.from_dict(m.to_dict())
    assert again.samples == m.samples and again.median == m.median


def test_noisy_measurement_warns_only_off_a_quiet_machine(monkeypatch):
    import warnings

    from labkit.core import timing

    m = Measurement.from_values("n", [1.0, 2.0, 3.0])
    for busy in (None, True):  # not read yet, or busy: close other programs
        monkeypatch.setattr(timing, "machine_busy", busy)
        with pytest.warns(UserWarning, match="spread .* close other programs"):
            m.warn_if_noisy()
    monkeypatch.setattr(timing, "machine_busy", False)  # quiet: the spread column says it, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m.warn_if_noisy()


def test_measure_against_sleep():
    calls = []

    def nap():
        calls.append(1)
        time.sleep(0.02)

    m = measure(nap, repeats=4, warmup=1, name="sleep")
    assert len(calls) == 5  # warmup excluded from samples but executed
    assert m.n == 4
    assert 0.019 <= m.median < 0.06
    assert m.first is not None and m.first >= 0.019


def test_measure_rejects_bad_counts():
    with pytest.raises(ValueError, match="repeats"):
        measure(lambda: None, repeats=0)
    with pytest.raises(ValueError, match="warmup"):
        measure(lambda: None, warmup=-1)


def test_track_context_manager():
    with timing.track() as t:
        time.sleep(0.01)
    assert t.seconds is not None and t.seconds >= 0.009


def test_one_percentile_rule_everywhere():
    """p99 only from at least timing.P99_MIN_SAMPLES values: Measurement, generation.aggregate and loadgen agree."""
    from labkit.core import timing
    from labkit.decoding import generation
    from labkit.serve import client, loadgen

    few, many = [float(i) for i in range(1, 33)], [float(i) for i in range(1, 201)]
    assert timing.p99(few) is None and Measurement.from_values("x", few).p99 is None
    assert timing.p99(many) == pytest.approx(198.01) == Measurement.from_values("x", many).p99
    outs = [client.RequestOutput(success=True, output_tokens=2, ttft_s=v, e2e_s=2 * v) for v in few]
    s = loadgen.BenchmarkResult(outputs=outs, duration_s=10.0).summary()
    assert s["ttft_p99_s"] is None and s["ttft_p90_s"] == pytest.approx(timing.percentile(few, 90))
    results = [generation.GenerationResult(n_prompt=3, n_out=2, ttft_s=v, e2e_s=2 * v) for v in few]
    assert generation.aggregate(results)["ttft_s"]["p99"] is None


def test_every_interval_goes_through_the_timing_primitive():
    """One timing primitive (DESIGN.md): labkit, the benches and the notebooks read the clock through
    ``timing`` (``track``/``measure``/``now`` for device work, ``clock`` for host work), never ``perf_counter``."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    files = [p for d in ("labkit", "bench", "notebooks/src", "notebooks/solutions") for p in (root / d).rglob("*.py")]
    assert len(files) > 20, "the lint must see the sources"
    offenders = [f"{p.relative_to(root)}:{i}" for p in files if p.name != "timing.py" or p.parent.name != "core"
                 for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                 if re.search(r"\bperf_counter\b", line.split("#", 1)[0])]
    assert not offenders, f"time these through labkit.core.timing (clock() for host work): {offenders}"


def test_interleave_times_variants_in_shuffled_rounds_with_the_baseline_again_after_them():
    order = []
    calls = {name: (lambda name=name: order.append(name)) for name in "ABC"}
    result = timing.interleave(calls, rounds=3, warmup=1)
    assert order[:3] == list("ABC") and order[-1] == "A"  # warmups in order; the baseline's extra pass last
    assert [sorted(order[3 + 3 * i: 6 + 3 * i]) for i in range(3)] == [list("ABC")] * 3  # each round runs each once
    assert [tuple(order[3 + 3 * i: 6 + 3 * i]) for i in range(3)] == result.order
    assert [result[n].n for n in "ABC"] == [3, 3, 3] and result.baseline == "A"  # the extra pass is not a sample
    assert "after the last round" in result.drift_line() and result["B"].meta["interleaved"]
    with pytest.raises(ValueError, match="rounds=0"):
        timing.interleave(calls, rounds=0)


def test_measure_warns_when_its_samples_disagree(monkeypatch):
    monkeypatch.setattr(timing, "machine_busy", None)  # no load line read yet (an earlier test may have read one)
    state = {"i": 0}

    def uneven():
        state["i"] += 1
        time.sleep(0.001 if state["i"] % 2 else 0.02)

    with pytest.warns(UserWarning, match="spread .* exceeds 10%"):
        timing.measure(uneven, repeats=4, warmup=0, name="uneven")


def test_rounds_keep_the_round_index_and_the_extra_baseline_pass_apart():
    order = []
    done = timing.rounds({m: (lambda m=m: order.append(m) or len(order)) for m in "ABC"}, 2, shuffle=False)
    assert "".join(order) == "ABCABCA"
    assert done == {"A": [1, 4], "B": [2, 5], "C": [3, 6]} and done.again == 7 and done.ends() == [1, 7]
    assert done.order == [tuple("ABC")] * 2
    order.clear()
    no_extra = timing.rounds({"A": lambda: order.append("A"), "B": lambda: order.append("B")}, 2, again=False,
                             shuffle=False)
    assert order == ["A", "B", "A", "B"] and no_extra.again is None and no_extra.ends() == [None]
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="positive integer"):
            timing.rounds({"A": lambda: None}, bad)
    with pytest.raises(ValueError, match="at least one call"):
        timing.rounds({}, 2)


def test_rounds_shuffle_each_round_by_default_every_order_about_equally_often_and_repeatably():
    def run(seed=timing.ORDER_SEED):
        stamps = []
        done = timing.rounds({m: (lambda m=m: stamps.append(m) or len(stamps)) for m in "AB"}, 200, again=False,
                             seed=seed)
        return done, stamps

    done, stamps = run()
    firsts = [o[0] for o in done.order]
    assert 70 <= firsts.count("A") <= 130, "each order should run about half the time"
    assert "".join(stamps) == "".join("".join(o) for o in done.order)  # the order recorded is the order run
    for i, o in enumerate(done.order):  # round i's results sit at index i whichever ran first
        a, b = done["A"][i], done["B"][i]
        assert (a < b) == (o[0] == "A") and abs(a - b) == 1
    assert run()[0].order == done.order and run(seed=1)[0].order != done.order  # seeded: a rerun repeats it


def test_sync_never_creates_a_cuda_context_for_a_host_interval(monkeypatch):
    import torch

    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(device))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    timing.sync(None)
    timing.now()
    assert calls == []  # CUDA present but not initialised: nothing to wait for, and no context created
    timing.sync("cuda:1")
    assert calls == [torch.device("cuda:1")]  # a named device is waited for
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    timing.sync(None)
    assert calls[-1] is None and len(calls) == 2
    timing.sync("cpu")
    assert len(calls) == 2


def test_one_latency_summary_for_the_load_generator_the_panel_and_the_router():
    from labkit.core import timing
    from labkit.serve import client, loadgen

    values = [0.1, 0.2, 0.3, 0.4, 1.0]
    got = timing.latency_summary("ttft", values)
    assert got["ttft_p50_s"] == 0.3 and abs(got["ttft_mean_s"] - 0.4) < 1e-12 and got["ttft_p99_s"] is None
    assert got["ttft_p90_s"] == timing.percentile(values, 90)
    assert timing.latency_summary("e2e", [], ("p10", "p50")) == {"e2e_p10_s": None, "e2e_p50_s": None}
    with pytest.raises(ValueError, match="choose from"):
        timing.latency_summary("e2e", values, ("p95",))
    outs = [client.RequestOutput(success=True, output_tokens=2, ttft_s=v, e2e_s=2 * v) for v in values]
    summary = loadgen.BenchmarkResult(outs, duration_s=1.0).summary()
    assert {k: summary[k] for k in got} == got
