"""Notebook 06 judges every comparison paired, round by round: the sweep's batch sizes, the padding cases, the
server's two batch sizes and the two arrival shapes, each from rounds of short passes (``timing.rounds``)."""
from __future__ import annotations

import pytest

from labkit.core import timing, verdict
from labkit.lessons.nb06 import findings as nb06
from labkit.lessons.nb06 import runs as nb06_runs

JITTER = (0.97, 1.02, 1.0, 0.99, 1.03, 0.98, 1.01, 1.0)  # a pass's own noise, a few per cent
DRIFT = (1.0, 1.3, 0.8, 1.25, 0.75, 1.2, 0.85, 1.1)  # the machine's speed from round to round: ±30 %


def _passes(value, n=6, shift=0, drift=False):
    """``n`` per-round values around ``value``: a few per cent of noise (``shift`` moves the pattern, so two sides
    do not move together), times the machine's drift when ``drift``."""
    return [value * JITTER[(i + shift) % len(JITTER)] * (DRIFT[i % len(DRIFT)] if drift else 1.0) for i in range(n)]


def _sweep_row(b, total, user, n=6, ttft=0.1, agreement=1.0):
    return {"batch_size": b, "status": "ok", "total_tokens_per_s": total, "tokens_per_s_per_user": user, "ttft_s": ttft,
            "agreement": agreement, "samples": {"total_tokens_per_s": _passes(total, n, b),
                                                "tokens_per_s_per_user": _passes(user, n, b)}}


def _takeaways(n=6, **over):
    sweep = [_sweep_row(1, 10.0, 10.0, n), _sweep_row(8, 50.0, 6.25, n, ttft=0.4)]
    padding = [{"case": "mixed", "wasted_fraction": 0.6, "ttft_s": 2.0, "agreement": 1.0,
                "samples": {"ttft_s": _passes(2.0, n)}},
               {"case": "bucketed", "wasted_fraction": 0.1, "ttft_s": 1.0, "agreement": 1.0,
                "samples": {"ttft_s": _passes(1.0, n, 3)}}]
    serving = [{"max_batch_size": 1, "mean_batch_size": 1.0, "output_tokens_per_s": 10.0, "tpot_p50_s": 0.05, "failed": 0,
                "samples": {"output_tokens_per_s": _passes(10.0, n), "tpot_p50_s": _passes(0.05, n)}},
               {"max_batch_size": 8, "mean_batch_size": 6.5, "output_tokens_per_s": 40.0, "tpot_p50_s": 0.08, "failed": 0,
                "samples": {"output_tokens_per_s": _passes(40.0, n, 2), "tpot_p50_s": _passes(0.08, n, 5)}}]
    open_loop = [{"arrivals": "Poisson", "ttft_p90_s": 0.5, "goodput": 1.9, "samples": {"ttft_p90_s": _passes(0.5, n)}},
                 {"arrivals": "bursty", "ttft_p90_s": 1.5, "goodput": 1.2,
                  "samples": {"ttft_p90_s": _passes(1.5, n, 4)}}]
    args = dict(sweep=sweep, memory_bound_gain=7.5, padding=padding, serving=serving, open_loop=open_loop, clients=8,
                request_rate=2.0)
    args.update(over)
    return " ".join(nb06.takeaways(**args).sentences)


def test_every_comparison_of_06_is_judged_paired_and_its_words_follow():
    text = _takeaways()
    assert "Batch 8 gave 5.0× the total tokens/s of batch 1" in text
    assert "0.62× batch 1's speed (slower)" in text
    assert "prefilled faster than the mixed batch (2.0" in text and "paired sign-flip test, 6 pairs" in text
    assert "served 4.0" in text and "the tokens/s of max_batch_size 1 (more)" in text
    assert "max_batch_size 8 (mean batch 6.5) served 4.0" in text
    assert "each token took 1.6" in text and "as long: slower (paired sign-flip test, 6 pairs" in text
    assert "TTFT p90 3.0" in text and "(pass by pass: longer, paired sign-flip test, 6 pairs" in text


def test_fewer_than_six_rounds_name_no_difference_whatever_the_ratio():
    text = _takeaways(n=3)
    assert "gave 5.0× the total tokens/s" not in text and "no verdict (3 pairs" in text
    assert "(more)" not in text and "slower (" not in text and "longer" not in text
    assert text.count("a paired test needs at least 6; run 3 more pairs") >= 5


def test_pairing_sees_through_drift_that_hides_a_difference_from_the_unpaired_rule():
    """Bursty TTFT p90s 12 % above Poisson's in every round, on a machine whose speed moves ±30 % between rounds:
    paired, bursty is longer; the two sides' p10–p90 ranges overlap, so the unpaired rule would call it noise."""
    poisson = {"arrivals": "Poisson", "ttft_p90_s": 0.5, "goodput": 1.0,
               "samples": {"ttft_p90_s": _passes(0.5, 8, drift=True)}}
    bursty = {"arrivals": "bursty", "ttft_p90_s": 0.56, "goodput": 1.0,
              "samples": {"ttft_p90_s": [x * 1.12 for x in _passes(0.5, 8, drift=True)]}}
    worse, v = nb06.worse_ttft([poisson, bursty])
    assert worse == "bursty" and v.paired and v.n == 8
    unpaired = verdict.compare(bursty["samples"]["ttft_p90_s"], poisson["samples"]["ttft_p90_s"], higher_is_better=False)
    assert not unpaired.real, unpaired


def test_arrivals_that_swap_places_from_round_to_round_crown_no_one(capsys):
    from labkit.lessons import exercises

    p90 = [0.3, 0.9, 0.4, 0.8, 0.35, 0.85]
    noisy = [{"arrivals": "Poisson", "ttft_p90_s": 0.6, "samples": {"ttft_p90_s": p90}},
             {"arrivals": "bursty", "ttft_p90_s": 0.6, "samples": {"ttft_p90_s": [p90[i ^ 1] for i in range(6)]}}]
    worse, v = nb06.worse_ttft(noisy)
    assert worse is None and v.kind == verdict.NO_VERDICT and "more pairs" in v.reason
    exercises.reveal_choice("worse TTFT p90", "bursty", worse, ["Poisson", "bursty"], undecided=f"{v.label} ({v.reason})")
    assert "no winner can be named in this run: no verdict (6 pairs)" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ the runs' rounds


class _Server:
    """A lab server stand-in: its batch size, counters that grow with each pass, and a scrape per call."""

    def __init__(self) -> None:
        self.url, self.batch, self.batches, self.seqs, self.scrapes = "http://lab", None, 0, 0, 0

    def configure(self, max_batch_size=None):
        self.batch = max_batch_size

    def stats(self):
        return {"batches": self.batches, "sequences": self.seqs}


def test_batch_size_rounds_pair_short_passes_in_shuffled_rounds(monkeypatch):
    server, ran = _Server(), []

    def fake_run(url, **kw):
        from labkit.serve import client, loadgen

        ran.append((server.batch, kw["num_requests"], kw.get("warmup", 1)))
        if kw["max_tokens"] == 4:  # the warm-up of each shape
            return loadgen.BenchmarkResult(outputs=[], duration_s=1.0)
        server.batches += 8 // server.batch
        server.seqs += 8
        rate = 8.0 * server.batch ** 0.5 * (1 + 0.01 * len(ran))
        out = [client.RequestOutput(success=True, output_tokens=4, ttft_s=0.1, e2e_s=0.5) for _ in range(8)]
        return loadgen.BenchmarkResult(outputs=out, duration_s=32 / rate)

    monkeypatch.setattr(nb06_runs.loadgen, "run", fake_run)
    monkeypatch.setattr(nb06_runs.prom, "scrape", lambda url: object())
    monkeypatch.setattr(nb06_runs.prom, "mean_batch_between",
                        lambda before, after: (after["sequences"] - before["sequences"]) / (after["batches"] - before["batches"]))
    rows, scraped = nb06_runs.batch_size_rounds(server, (1, 8), 6, clients=8, num_requests=8, max_tokens=8)
    assert [r[0] for r in ran[:2]] == [1, 8] and all(w == 0 for _, _, w in ran[2:]), "warm each shape once, then passes"
    assert len(ran) == 2 + 12 and set(scraped) == {1, 8}
    one, eight = rows
    assert one["rounds"] == eight["rounds"] == 6 and len(eight["samples"]["output_tokens_per_s"]) == 6
    assert eight["mean_batch_size"] == 8 and one["mean_batch_size"] == 1 and one["completed"] == 48
    order = [b for b, n, w in ran[2:]]
    assert order != [1, 8] * 6, "each round runs in a shuffled order"
    serve_v, _ = nb06.server_verdicts(one, eight)
    assert serve_v.paired and serve_v.kind == verdict.BETTER and serve_v.gain == pytest.approx(8 ** 0.5, rel=0.05)


def test_arrival_rounds_give_both_shapes_the_same_seed_each_round(monkeypatch):
    seen = []

    def fake_run(url, **kw):
        from labkit.serve import client, loadgen

        seen.append((kw["burstiness"], kw["seed"]))
        assert kw["warmup"] == 0, "the server is warm: a pass sends no warm-up request of its own"
        out = [client.RequestOutput(success=True, output_tokens=4, ttft_s=0.1 / kw["burstiness"] * kw["seed"], e2e_s=1.0)]
        return loadgen.BenchmarkResult(outputs=out, duration_s=1.0, slo=kw.get("slo"))

    monkeypatch.setattr(nb06_runs.loadgen, "run", fake_run)
    rows = nb06_runs.arrival_rounds("http://lab", {"Poisson": 1.0, "bursty": 0.25}, 6, num_requests=1, request_rate=2.0,
                                    max_tokens=4)
    assert sorted(seen) == sorted([(1.0, i) for i in range(1, 7)] + [(0.25, i) for i in range(1, 7)])
    poisson, bursty = rows
    assert poisson["samples"]["ttft_p90_s"] == pytest.approx([0.1 * i for i in range(1, 7)])
    worse, v = nb06.worse_ttft(rows)
    assert worse == "bursty" and v.ratio == pytest.approx(4.0) and v.paired


def test_static_sweep_rounds_pair_every_size_and_keep_the_drift_pass_apart(tiny_llama, monkeypatch):
    from labkit.serve.experiments import batching

    model, tok = tiny_llama
    orders = []
    real = timing.rounds

    def spy(calls, n, **kw):
        out = real(calls, n, **kw)
        orders.append(out.order)
        return out

    monkeypatch.setattr(batching.timing, "rounds", spy)
    rows = batching.static_sweep(model, tok, batch_sizes=[1, 2], new_tokens=2, repeats=6)
    assert [len(r["samples"]["total_tokens_per_s"]) for r in rows] == [6, 6], "batch 1's extra pass is not a round"
    assert rows[0]["drift"] > 0 and len(set(orders[0])) == 2, "rounds run in a shuffled order"
    total, _ = nb06.batch_verdicts(rows[0], rows[1], memory_bound_gain=2.0)
    assert total.paired and total.n == 6
    pad = batching.padding_experiment(model, tok, batch=3, new_tokens=2, long_repeat=1, repeats=6)
    assert all(len(r["samples"]["ttft_s"]) == 6 for r in pad)
    assert pad[-1]["samples"]["ttft_s"] == pytest.approx([a + b for a, b in zip(pad[1]["samples"]["ttft_s"],
                                                                               pad[2]["samples"]["ttft_s"])])


def test_batching_findings_on_a_busy_machine_say_implausible_not_a_lesson():
    # recorded on a 2-core machine at load 3-8: "Batch 8 gave 25.4× the total tokens/s of batch 1 (more than the
    # memory-bound model's 7.8×); each user got 3.18× batch 1's speed"
    sweep = [_sweep_row(1, 0.5, 0.5), _sweep_row(8, 12.7, 1.59)]
    text = _takeaways(sweep=sweep, memory_bound_gain=7.8)
    assert "implausible — rerun" in text and "beats its bound 7.80×" in text and "gave 25.4×" not in text
    assert "3.1" in text and "batch 1's speed (implausible — rerun" in text
    # one value each: no verdict, whatever the ratio says
    single = [{k: v for k, v in r.items() if k != "samples"} for r in (_sweep_row(1, 10.0, 10.0), _sweep_row(8, 50.0, 6.25))]
    text = _takeaways(sweep=single)
    assert "no verdict" in text and "1 pair" in text and "gave 5.0×" not in text
    # batch 8 below batch 1: a batch cannot lose to one row at a time
    assert "falls below its floor 1.00×" in _takeaways(sweep=[_sweep_row(1, 10.0, 10.0), _sweep_row(8, 4.0, 0.5)])
    with pytest.raises(ValueError, match="two server rows"):
        _takeaways(serving=[])
