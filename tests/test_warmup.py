import pytest

from labkit.core import env
from labkit.decoding import cache_variants, quality
from labkit.engines import warmup
from labkit.engines.warmup import ColdStart, WarmupReport


class FakeService:
    """A callable whose latency (on a fake clock) falls from ``slow_s`` over the first ``k`` calls, then stays
    at ``fast_s``, as a warming service's does."""

    def __init__(self, k: int, slow_s: float = 1.0, fast_s: float = 0.1, jitter: list[float] | None = None):
        self.k, self.slow_s, self.fast_s = k, slow_s, fast_s
        self.jitter = jitter or [0.0]
        self.t = 0.0
        self.calls = 0

    def clock(self) -> float:
        return self.t

    def __call__(self) -> None:
        i = self.calls
        base = self.fast_s + (self.slow_s - self.fast_s) * (self.k - i) / self.k if i < self.k else self.fast_s
        self.t += base * (1 + self.jitter[self.calls % len(self.jitter)])
        self.calls += 1


@pytest.mark.parametrize("k", [0, 1, 3, 7])
def test_reports_the_calls_before_latency_settles(k):
    svc = FakeService(k, jitter=[0.0, 0.02, -0.02])  # 2 % jitter once settled: under the 10 % bar
    rep = warmup.warmup_calls(svc, until_spread=0.10, max_calls=30, window=5, clock=svc.clock)
    assert rep.settled
    assert rep.warmup_calls == k
    assert rep.calls == svc.calls == k + 5
    assert rep.final_spread is not None and rep.final_spread < 0.10
    assert rep.steady_s == pytest.approx(0.1, rel=0.03)
    assert all(t > 0.1 * 1.05 for t in rep.latencies_s[:k])  # every warmup call was slower than steady


def test_never_loops_forever_when_latency_never_settles():
    svc = FakeService(k=0, jitter=[0.0, 0.5])  # alternates 0.10 s and 0.15 s: always 50 % apart
    rep = warmup.warmup_calls(svc, until_spread=0.10, max_calls=12, window=4, clock=svc.clock)
    assert not rep.settled and rep.warmup_calls is None and rep.steady_s is None
    assert rep.calls == svc.calls == 12
    assert rep.final_spread is not None and rep.final_spread > 0.10


def test_a_looser_bar_settles_the_same_series():
    svc = FakeService(k=0, jitter=[0.0, 0.5])
    rep = warmup.warmup_calls(svc, until_spread=0.6, max_calls=12, window=4, clock=svc.clock)
    assert rep.settled and rep.warmup_calls == 0 and rep.calls == 4


def test_settle_point_and_window_spreads_agree_with_the_helper():
    lat = [3.0, 2.0, 1.2, 1.0, 1.01, 0.99, 1.0, 1.02, 1.0]
    spreads = warmup.window_spreads(lat, window=4)
    assert spreads[:3] == [None, None, None] and all(s is not None for s in spreads[3:])
    point = warmup.settle_point(lat, until_spread=0.10, window=4)
    assert point == 3  # the first steady window is lat[3:7]
    assert warmup.settle_point([1.0, 2.0, 1.0, 2.0], until_spread=0.10, window=2) is None


@pytest.mark.parametrize("kwargs, match", [
    ({"window": 1}, "window"),
    ({"max_calls": 3, "window": 5}, "max_calls"),
    ({"until_spread": 0}, "until_spread"),
    ({"until_spread": -0.1}, "until_spread"),
])
def test_bad_arguments_name_the_fix(kwargs, match):
    with pytest.raises(ValueError, match=match):
        warmup.warmup_calls(lambda: None, **kwargs)


def test_report_round_trips_through_json():
    svc = FakeService(2)
    rep = warmup.warmup_calls(svc, max_calls=10, window=3, clock=svc.clock)
    again = WarmupReport.from_dict(rep.to_dict())
    assert again == rep and rep.to_dict()["calls"] == 5


def test_warmup_on_a_real_model(tiny_llama):
    model, tok = tiny_llama
    rep = warmup.warmup(model, tok, until_spread=0.5, max_calls=8, window=3, max_new_tokens=3)
    assert 3 <= rep.calls <= 8
    assert all(t > 0 for t in rep.latencies_s)
    assert rep.settled == (rep.warmup_calls is not None)


@pytest.mark.slow
def test_cold_start_in_a_fresh_process():
    cs = warmup.cold_start(requests=3, max_new_tokens=2, timeout_s=300)
    assert isinstance(cs, ColdStart)
    assert len(cs.requests_s) == 3 and len(cs.ttft_s) == 3
    assert cs.process_start_s is not None and cs.process_start_s > 0
    assert cs.import_s > 0 and cs.load_s > 0
    assert all(0 < ttft <= e2e for ttft, e2e in zip(cs.ttft_s, cs.requests_s))
    assert cs.second_request_s == cs.requests_s[1]
    check_cuda_init(cs, env.device())
    # the first request touches every weight: resident memory grows by part of the weights at least
    assert cs.rss_bytes["after_request_1"] >= cs.rss_bytes["after_load"]
    assert ColdStart.from_dict(cs.to_dict()) == cs
    assert list(cs.phases_frame()["phase"]) == [p.removesuffix("_s") for p in warmup.PHASES]


def check_cuda_init(cs: ColdStart, device: str) -> None:
    """The cold start ran on ``device`` (the device this machine gives notebooks: the GPU where there is one),
    and timed CUDA's context creation exactly when that device is a GPU."""
    assert cs.device == device
    if device.startswith("cuda"):
        assert cs.cuda_init_s is not None and cs.cuda_init_s > 0 and cs.notes["cuda_init_s"]
    else:
        assert cs.cuda_init_s is None and cs.notes["cuda_init_s"]


def test_the_cold_start_checks_hold_on_a_gpu_and_on_a_cpu():
    """test_cold_start_in_a_fresh_process runs on whatever this machine is: on a GPU its cold start runs on
    cuda and times the CUDA context, which the checks must accept (they asserted a CPU device)."""
    def run_on(device: str, cuda_init_s: float | None, note: str) -> ColdStart:
        return ColdStart(process_start_s=0.5, import_s=2.0, cuda_init_s=cuda_init_s, load_s=1.0,
                         requests_s=[0.3, 0.2], ttft_s=[0.1, 0.05], rss_bytes={}, device=device, torch_threads=2,
                         compile=False, max_new_tokens=2, notes={"cuda_init_s": note})

    check_cuda_init(run_on("cuda", 0.4, "CUDA context creation"), "cuda")
    check_cuda_init(run_on("cpu", None, "no CUDA context on cpu"), "cpu")
    with pytest.raises(AssertionError):
        check_cuda_init(run_on("cpu", None, "no CUDA context on cpu"), "cuda")


def test_cold_start_rejects_bad_input():
    with pytest.raises(ValueError, match="requests"):
        warmup.cold_start(requests=0)
    with pytest.raises(ValueError, match="window"):
        warmup.cold_start(warm=True, window=1)


def test_fresh_compile_cache_is_empty_and_removed_after():
    import os

    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with cache_variants.fresh_compile_cache() as path:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == path
        assert os.path.isdir(path) and not os.listdir(path)
    assert not os.path.exists(path)
    # torch may write its default directory back into the variable; either way ours is gone from it
    assert os.environ.get("TORCHINDUCTOR_CACHE_DIR") != path
    if before is not None:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == before


def test_break_even_calls():
    # compiling costs 10 s more on the first call and saves 0.5 s per call after it
    assert warmup.break_even_calls(12.0, 1.5, 2.0, 2.0) == pytest.approx(20.0)
    assert warmup.break_even_calls(12.0, 2.5, 2.0, 2.0) is None  # compiled is slower: never pays back
    assert warmup.break_even_calls(1.0, 1.0, 2.0, 2.0) == 0.0  # faster from the first call on


def test_one_time_share_and_token_agreement():
    assert warmup.one_time_share([2.0, 0.6, 0.5, 0.5, 0.5], window=3) == pytest.approx(0.75)
    with pytest.raises(ValueError, match="steady window"):
        warmup.one_time_share([1.0, 0.5], window=3)

    class Tok:  # one token per word
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": text.split()}

    assert quality.token_agreement(Tok(), "Paris is the capital", "Paris is the capital") == 1.0
    assert quality.token_agreement(Tok(), "Paris is a city", "Paris is the capital") == 0.5
    assert quality.token_agreement(Tok(), "Paris", "Paris is") == 0.5


def test_cold_start_texts_round_trip():
    cs = ColdStart(process_start_s=0.1, import_s=1.0, cuda_init_s=None, load_s=2.0, requests_s=[0.5, 0.2],
                   ttft_s=[0.1, 0.05], rss_bytes={}, device="cpu", torch_threads=2, compile=False, max_new_tokens=8,
                   texts=["a", "b"])
    assert ColdStart.from_dict(cs.to_dict()).texts == ["a", "b"]
    old = cs.to_dict()
    del old["texts"]
    assert ColdStart.from_dict(old).texts == []  # results written before answers were recorded still load


def _cold(device: str, gpu_bytes: dict | None = None) -> ColdStart:
    mib = 2**20
    return ColdStart(process_start_s=0.1, import_s=1.0, cuda_init_s=0.8 if device != "cpu" else None, load_s=2.0,
                     requests_s=[0.5, 0.2, 0.2, 0.2, 0.2, 0.2], ttft_s=[0.1] * 6,
                     rss_bytes={"after_import": 900 * mib, "after_load": 1000 * mib, "after_request_1": 1001 * mib,
                                "after_request_2": 1001 * mib},
                     device=device, torch_threads=2, compile=False, max_new_tokens=8, gpu_bytes=gpu_bytes or {})


def test_the_first_requests_memory_growth_is_read_where_the_weights_live():
    """On a GPU the weights sit in device memory: the first request's growth comes from the CUDA allocator and
    NVML, never from the host RSS (which a GPU run barely moves)."""
    import pandas as pd

    from labkit.lessons.nb04 import findings as nb04

    mib = 2**20
    gpu = _cold("cuda:0", {"after_load": {"cuda_allocated": 520 * mib, "nvml": 900 * mib},
                           "after_request_1": {"cuda_allocated": 540 * mib, "nvml": 960 * mib}})
    assert warmup.first_request_growth(gpu) == {"cuda_allocated": 20 * mib, "nvml": 60 * mib}
    assert warmup.first_request_growth(_cold("cpu")) == {"rss": 1 * mib}
    no_nvml = _cold("cuda:0", {"after_load": {"cuda_allocated": 520 * mib, "nvml": None},
                               "after_request_1": {"cuda_allocated": 540 * mib, "nvml": None}})
    assert warmup.first_request_growth(no_nvml) == {"cuda_allocated": 20 * mib, "nvml": None}
    summary = pd.DataFrame({"first_s": [0.5, 0.3], "median_s": [0.2, 0.2], "agreement": [1.0, 1.0]},
                           index=["cold", "warmed"])
    found = nb04.takeaways(cold=gpu, warmed=gpu, steady_s=0.2, one_time_share=0.6,
                            memory_growth=warmup.first_request_growth(gpu), weight_bytes=513 * mib,
                            loop_warmup_calls=2, loop_calls=7, summary=summary, compile_rows=pd.DataFrame())
    text = " ".join(found.sentences)
    assert "PyTorch's CUDA allocator grew by 20 MiB" in text and "NVML" in text and "RSS" not in text
    assert {r["finding"] for r in found.rows} >= {"cuda_allocated growth of the first request / weight bytes",
                                                  "nvml growth of the first request / weight bytes"}


def test_cold_start_records_device_memory_beside_the_rss(monkeypatch):
    """gpu_point reads the allocator and NVML of the device asked; a result round-trips with them."""
    import torch

    from test_devices import mock_gpu

    mock_gpu(monkeypatch)
    asked = []
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: asked.append(str(device)) or 42)
    point = warmup.gpu_point("cuda:0")
    assert point["cuda_allocated"] == 42 and asked == ["cuda:0"] and "nvml" in point
    cs = _cold("cuda:0", {"after_load": point})
    assert ColdStart.from_dict(cs.to_dict()).gpu_bytes == {"after_load": point}


def test_a_first_call_inside_the_windows_tolerance_is_kept_and_its_cost_still_said():
    """A first call 12 % slower than the rest sits inside a 5-call window's 10 % spread (p90 interpolates): the
    stopping rule discards no call, and the sentence says so beside the 12 % the first call paid — not
    "settled after 0 warmup calls" next to a one-time cost it seems to deny."""
    from labkit.lessons.nb04 import findings as nb04

    lat = [0.1136, 0.1, 0.1, 0.1, 0.1, 0.1]  # (0.1136 - 0.1) / 0.1136 = 12 % one-time share
    assert warmup.settle_point(lat, 0.10, 5) == 0 and warmup.window_spread(lat[:5]) < 0.10
    words = nb04.settle_words(lat, 0.10, 5)
    assert "no call had to be discarded" in words and "under 10%" in words
    assert "the first call still paid 12.0% one-time cost" in words and "settled after" not in words
    assert "only partly sees one slow call" in words
    assert "2 call(s) were discarded" in nb04.settle_words([0.3, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1], 0.10, 5)
    assert "no window settled within 6 calls" in nb04.settle_words([0.1, 0.2] * 3, 0.10, 5)
    flat = nb04.settle_words([0.1] * 5, 0.10, 5)
    assert "no call had to be discarded" in flat and "the first call was within noise against that window's calls" in flat


def test_the_warmup_takeaway_names_the_rule_behind_each_number():
    import pandas as pd

    from labkit.lessons.nb04 import findings as nb04

    cold = _cold("cpu")
    summary = pd.DataFrame({"first_s": [0.5, 0.3], "median_s": [0.2, 0.2], "agreement": [1.0, 1.0]},
                           index=["cold", "warmed"])
    found = nb04.takeaways(cold=cold, warmed=cold, steady_s=0.2, one_time_share=0.12, memory_growth={"rss": 2**20},
                           weight_bytes=2**27, loop_warmup_calls=0, loop_calls=5, summary=summary,
                           compile_rows=pd.DataFrame(), loop_latencies_s=[0.1136, 0.1, 0.1, 0.1, 0.1],
                           until_spread=0.10, window=5)
    text = " ".join(found.sentences)
    assert "12% of it was one-time cost (the cold process's first request against the median" in text
    assert "The warmup loop written here: no call had to be discarded" in text
    assert "no call had to be discarded by the stopping rule" in text and "settled after 0" not in text


def test_a_compile_gain_within_noise_claims_no_pay_back():
    """The recorded run: one MLP compiled 1.802 ms against eager 1.855 ms (2.9 %, 5 repeats each, overlapping):
    "pays back after 107,396 calls" read a pay-back into noise."""
    import pandas as pd

    from labkit.lessons.nb04 import findings as nb04

    mib = 2**20
    cpu = _cold("cpu")
    summary = pd.DataFrame({"first_s": [0.5, 0.3], "median_s": [0.2, 0.2], "agreement": [1.0, 1.0]},
                           index=["cold", "warmed"])

    def said(compiled, eager):
        rows = pd.DataFrame([{"target": "one MLP layer", "where": "this run", "compiled_first_s": 5.6,
                              "eager_first_s": 0.004, "compiled_s": sorted(compiled)[2], "eager_s": sorted(eager)[2],
                              "break_even_calls": 107396.0, "samples": {"compiled_s": compiled, "eager_s": eager}}])
        found = nb04.takeaways(cold=cpu, warmed=cpu, steady_s=0.2, one_time_share=0.1, memory_growth={"rss": mib},
                               weight_bytes=513 * mib, loop_warmup_calls=0, loop_calls=5, summary=summary,
                               compile_rows=rows)
        return " ".join(found.sentences)

    noisy = said([1.70e-3, 1.78e-3, 1.802e-3, 1.85e-3, 1.95e-3], [1.75e-3, 1.80e-3, 1.855e-3, 1.90e-3, 2.0e-3])
    assert "no measurable steady gain (within noise" in noisy and "107,396" not in noisy
    real = said([1.0e-3, 1.01e-3, 1.02e-3, 1.03e-3, 1.04e-3], [1.8e-3, 1.82e-3, 1.855e-3, 1.87e-3, 1.9e-3])
    assert "pays back after 107,396 calls" in real

    # timed in rounds (compile_cost: round i of eager beside round i of compiled): 3 % faster in every round of a
    # machine drifting ±15 % is a gain paired, which the unpaired rule, on the same samples, calls noise
    walk = [0.85, 1.15, 0.9, 1.1, 0.95, 1.05, 0.88, 1.12]
    eager = [1.855e-3 * f for f in walk]
    compiled = [x / 1.03 * j for x, j in zip(eager, (1.002, 0.998, 1.0, 1.001, 0.999, 1.0, 1.002, 0.998))]
    rows = pd.DataFrame([{"target": "one MLP layer", "where": "this run", "compiled_first_s": 5.6, "eager_first_s": 0.004,
                          "compiled_s": 1.8e-3, "eager_s": 1.855e-3, "break_even_calls": 101800.0, "paired": True,
                          "samples": {"compiled_s": compiled, "eager_s": eager}},
                         {"target": "whole model", "where": "reference: AMD EPYC, 2026-12-06", "compiled_first_s": 28.0,
                          "eager_first_s": 2.8, "compiled_s": 2.3, "eager_s": 2.5, "break_even_calls": 126.0,
                          "paired": False, "judged": "judged unpaired, recorded 2026-12-06",
                          "samples": {"compiled_s": [2.3, 2.35, 2.25], "eager_s": [2.5, 2.55, 2.45]}}])
    text = " ".join(nb04.takeaways(cold=cpu, warmed=cpu, steady_s=0.2, one_time_share=0.1, memory_growth={"rss": mib},
                                   weight_bytes=513 * mib, loop_warmup_calls=0, loop_calls=5, summary=summary,
                                   compile_rows=rows).sentences)
    assert "torch.compile, one MLP layer (this run): first call" in text and "pays back after 101,800 calls" in text
    assert "(reference: AMD EPYC, 2026-12-06; judged unpaired, recorded 2026-12-06)" in text
    rows.loc[0, "paired"] = False
    assert "no measurable steady gain (within noise" in " ".join(nb04.takeaways(
        cold=cpu, warmed=cpu, steady_s=0.2, one_time_share=0.1, memory_growth={"rss": mib}, weight_bytes=513 * mib,
        loop_warmup_calls=0, loop_calls=5, summary=summary, compile_rows=rows).sentences)


def test_compile_cost_times_eager_and_compiled_in_paired_rounds(monkeypatch):
    """The steady calls run in rounds, each in a shuffled order: one sample a round on each side, marked paired."""
    import torch

    calls = []
    monkeypatch.setattr(torch, "compile", lambda m: (lambda *a: calls.append("compiled") or m(*a)))
    layer = torch.nn.Linear(8, 8)
    cost = warmup.compile_cost(layer, torch.randn(2, 8), repeats=6, fresh_cache=False)
    assert cost["paired"] is True and cost["repeats"] == 6
    assert len(cost["samples"]["eager_s"]) == len(cost["samples"]["compiled_s"]) == 6
    assert calls.count("compiled") == 7  # the first (compiling) call, then one a round
    assert cost["compiled_first_s"] > 0 and cost["eager_first_s"] > 0
