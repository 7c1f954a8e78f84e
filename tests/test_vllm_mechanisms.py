"""labkit.serve.vllm.mechanisms without vLLM: the /metrics figures on a recorded scrape, the tokens check, and the
three workloads against a fake OpenAI server that stalls its streams while a long prompt prefills, hits its
prefix cache only within one cache salt, and counts drafts when it speculates."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from labkit.decoding import quality
from labkit.serve import processes
from labkit.serve.vllm import mechanisms as vm
from labkit.serve import metrics as prom
from labkit.serve.vllm import server as vs
from processes import gone
from test_vllm_server import SERVES, _fake_python

DATA = Path(__file__).parent / "data"
LONG = 200  # prompts at least this long are "long": the fake stalls every stream while it prefills one


def test_acceptance_and_hit_rate_from_a_recorded_scrape():
    totals = prom.metric_totals(prom.parse_prometheus((DATA / "vllm_metrics.txt").read_text()))
    acc = vm.acceptance(totals)  # a scrape is a delta from a fresh server
    assert (acc["drafts"], acc["draft_tokens"], acc["accepted_tokens"]) == (5, 20, 13)
    assert acc["acceptance_rate"] == pytest.approx(13 / 20) and acc["accepted_per_draft"] == pytest.approx(13 / 5)
    rate = vm.token_hit_rate(totals)
    assert rate == pytest.approx(totals[vm.HITS] / totals[vm.QUERIES])
    later = dict(totals, **{vm.DRAFT_TOKENS: totals[vm.DRAFT_TOKENS] + 10, vm.ACCEPTED: totals[vm.ACCEPTED] + 10,
                            vm.DRAFTS: totals[vm.DRAFTS] + 2})
    assert vm.acceptance(prom.metrics_delta(totals, later))["acceptance_rate"] == 1.0, "only what the run added"
    assert vm.acceptance({})["acceptance_rate"] is None and vm.token_hit_rate({}) is None, "nothing drafted: no rate"


def test_chunked_prefill_is_read_from_the_log():
    startup = (DATA / "vllm_startup.log").read_text()
    assert vm.chunked_prefill_logged(startup)["chunked_prefill"] is True, "the engine's config line says so"
    budget = "INFO [scheduler.py:307] Chunked prefill is enabled with max_num_batched_tokens=128.\n"
    assert vm.chunked_prefill_logged(startup + budget) == {"chunked_prefill": True, "budget": 128}
    given = "INFO [api_utils.py:286] non-default args: {'dtype': 'float32', 'max_num_batched_tokens': 2048}\n"
    assert vm.chunked_prefill_logged(given)["budget"] == 2048, "the budget it was given when the line is missing"
    assert vm.chunked_prefill_logged("INFO nothing about it") == {"chunked_prefill": None, "budget": None}
    off = startup.replace("enable_chunked_prefill=True", "enable_chunked_prefill=False")
    assert vm.chunked_prefill_logged(off)["chunked_prefill"] is False


def test_tokens_check_cuts_at_eos_and_names_the_first_difference():
    eos = {2}
    same = quality.answers_check({"a": [5, 6, 2, 9], "b": [7]}, {"a": [5, 6], "b": [7, 2]}, eos)
    assert same["identical"] and quality.check_line(same) == "identical (2 of 2)"
    diff = quality.answers_check({"a": [5, 6, 8], "b": [7]}, {"a": [5, 6, 9], "b": [7]}, eos)
    assert not diff["identical"] and diff["first_differences"] == {"a": 2}
    assert quality.check_line(diff) == "differ: a from token 2"
    short = quality.answers_check({"a": [5]}, {"a": [5, 6], "b": [1]}, eos)
    assert not short["identical"] and "b missing" in quality.check_line(short) and "a from token 1" in quality.check_line(short)


def test_budgets_differ_in_the_token_budget_only():
    base = vs.Settings(model="/m", max_num_seqs=4)
    two = vm.budgets(base, 128, 2048)
    assert (two["small"].max_num_batched_tokens, two["large"].max_num_batched_tokens) == (128, 2048)
    assert vars(two["small"]) | {"max_num_batched_tokens": 0} == vars(two["large"]) | {"max_num_batched_tokens": 0}
    with pytest.raises(ValueError, match="small < large"):
        vm.budgets(base, 2048, 128)
    with pytest.raises(ValueError, match="max_num_seqs"):
        vm.budgets(base, 2, 2048)


# ------------------------------------------------------------------------------------ a fake vLLM server


@dataclass
class Fake:
    """What the fake engine does: a token every ``tpot_s``; a long prompt stalls every stream for ``prefill_s``
    (unchunked) or for ``prefill_s / chunks`` at a time with a token between (chunked); a prompt prefix cached
    under the same salt answers sooner; with ``ngram`` each chunk carries two tokens, one of them a draft."""

    tpot_s: float = 0.01
    prefill_s: float = 0.3
    chunks: int = 1
    ngram: bool = False
    counters: dict[str, float] = field(default_factory=lambda: {vm.HITS: 0.0, vm.QUERIES: 0.0, vm.DRAFTS: 0.0,
                                                                vm.DRAFT_TOKENS: 0.0, vm.ACCEPTED: 0.0,
                                                                vm.TPOT + "_sum": 0.0, vm.TPOT + "_count": 0.0})
    cached: set = field(default_factory=set)
    stall_until: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def metrics(self) -> str:
        with self.lock:
            return "".join(f'{k}{{engine="0"}} {v}\n' for k, v in self.counters.items())


def _handler(fake: Fake):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            body = {"/v1/models": json.dumps({"data": [{"id": "fake"}]}), "/metrics": fake.metrics()}[self.path].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def chunk(self, payload: dict | str) -> None:
            data = f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            assert req["ignore_eos"] and req["return_token_ids"] and req["stream"]
            prompt, salt = req["prompt"], req.get("cache_salt")
            key = (salt, tuple(prompt[:8]))
            with fake.lock:
                hit = key in fake.cached
                fake.cached.add(key)
                fake.counters[vm.QUERIES] += len(prompt)
                fake.counters[vm.HITS] += len(prompt) // 2 if hit else 0
                if len(prompt) >= LONG:
                    fake.stall_until = time.monotonic() + fake.prefill_s / fake.chunks
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            time.sleep(0.01 if hit else 0.05)  # prefill: shorter from the cache
            n, left, first = 0, req["max_tokens"], None
            chunks_left = fake.chunks - 1 if len(prompt) >= LONG else 0
            while left > 0:
                wait = fake.stall_until - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                if chunks_left:  # the next chunk of this long prompt's prefill, after the streams' token
                    time.sleep(fake.tpot_s)
                    with fake.lock:
                        fake.stall_until = time.monotonic() + fake.prefill_s / fake.chunks
                    chunks_left -= 1
                    continue
                step = min(2 if fake.ngram else 1, left)
                if fake.ngram:
                    with fake.lock:
                        fake.counters[vm.DRAFTS] += 1
                        fake.counters[vm.DRAFT_TOKENS] += 2
                        fake.counters[vm.ACCEPTED] += step - 1
                self.chunk({"choices": [{"text": "x", "token_ids": list(range(n, n + step))}]})
                first, last = first or time.monotonic(), time.monotonic()
                n, left = n + step, left - step
                time.sleep(fake.tpot_s)
            with fake.lock:  # the engine's own TPOT: first to last token
                fake.counters[vm.TPOT + "_sum"] += (last - first) / (n - 1) if n > 1 else 0.0
                fake.counters[vm.TPOT + "_count"] += 1
            self.chunk({"choices": [], "usage": {"completion_tokens": n}})
            self.chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, *a):
            pass

    return H


class FakeServer:
    """Stands in for a ``VLLMServer``: url, settings, log, metrics."""

    def __init__(self, fake: Fake, budget: int = 2048):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.settings = vs.Settings(model="/m", max_num_batched_tokens=budget)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def log(self) -> str:
        return f"INFO Chunked prefill is enabled with max_num_batched_tokens={self.settings.max_num_batched_tokens}.\n"

    def metrics(self) -> dict[str, float]:
        return prom.totals(self.url)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    made: list[FakeServer] = []

    def make(fake: Fake, budget: int = 2048) -> FakeServer:
        made.append(FakeServer(fake, budget))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_a_long_prompt_stalls_the_streams_and_chunking_spreads_the_stall(servers):
    large = servers(Fake(prefill_s=0.3, chunks=1), 2048)
    small = servers(Fake(prefill_s=0.3, chunks=6), 128)
    streams, long_prompt = [[1] * 10, [2] * 10], [3] * LONG
    rows = vm.chunked_rounds({"large": large, "small": small}, streams, 20, long_prompt, n_rounds=3)
    big, little = rows["large"], rows["small"]
    assert big["logged_budget"] == 2048 and little["logged_budget"] == 128
    assert len(big["samples"]["stall_s"]) == 3 and len(big["samples"]["long_ttft_s"]) == 3, "one of each per round"
    assert big["stall_p50_s"] >= 0.25, "unchunked: the streams wait for the whole prefill"
    assert little["stall_p50_s"] < big["stall_p50_s"] / 2, "chunked: a token between chunks"
    assert big["itl_n"] == 3 * 2 * 19 and big["itl_tail"] == "p99" and big["itl_p99_s"] >= 0.25
    assert little["itl_p99_s"] < big["itl_p99_s"]
    assert big["answers"] == [list(range(20))] * 2 and big["same_answers_every_round"] and not big["errors"]


def test_the_long_prompt_must_arrive_while_streams_decode():
    with pytest.raises(ValueError, match="still decoding"):
        vm.long_prompt_while_streaming("http://127.0.0.1:9", [[1]], 4, [2], long_after=4)


def test_prefix_rounds_share_the_cache_only_within_a_salt(servers):
    srv = servers(Fake())
    prompts = {f"q{i}": [9] * 8 + [i] * 4 for i in range(4)}  # one shared first part, four questions
    rows = vm.prefix_rounds(srv, prompts, max_tokens=2, concurrency=1, n_rounds=3)
    without, with_ = rows["without"], rows["with"]
    assert without["hit_tokens"] == 0 and without["token_hit_rate"] == 0, "a salt of its own: nothing shared"
    assert with_["hit_tokens"] == 3 * 3 * 6, "three of four requests hit, in every round: a fresh salt per round"
    assert len(with_["samples"]["ttft_s"]) == 12 and len(with_["samples"]["ttft_p50_s"]) == 3, "per request, per round"
    assert with_["ttft_p50_s"] < without["ttft_p50_s"]
    assert with_["answers"] == {name: [0, 1] for name in prompts} and with_["same_answers_every_round"]


def test_speculative_rounds_read_acceptance_from_the_ngram_servers_metrics(servers):
    plain, ngram = servers(Fake(tpot_s=0.02)), servers(Fake(tpot_s=0.02, ngram=True))
    rows = vm.speculative_rounds(plain, ngram, {"copy": [1] * 30}, new_tokens=12, n_rounds=6)
    row = rows["copy"]
    assert row["drafts"] == 6 * 6 and row["acceptance_rate"] == pytest.approx(0.5), "deltas of six runs, no warm-up"
    assert row["decode_speedup"] > 1.3 and row["verdict"] == "better", "six pairs, each the n-gram server faster"
    assert "paired sign-flip test, 6 pairs" in row["verdict_reason"]
    assert len(row["samples"]["ngram_decode_tokens_per_s"]) == 6 and row["failed"] == 0
    fewer = vm.speculative_rounds(plain, ngram, {"copy": [1] * 30}, new_tokens=12, n_rounds=3)["copy"]
    assert fewer["verdict"] == "no verdict (3 pairs)", "below 6 pairs a paired test cannot decide"
    engine, client = row["samples"]["ngram_decode_tokens_per_s"], row["samples"]["client_ngram_decode_tokens_per_s"]
    assert all(50 < e <= 11 / (5 * 0.02) * 1.01 for e in engine), "the engine's TPOT from /metrics: 11 tokens, 5 gaps"
    assert len(client) == 6, "the client's kept beside it"
    assert row["plain_answer"] == row["ngram_answer"] == list(range(12))


def test_engine_tpot_from_a_recorded_scrape():
    totals = prom.metric_totals(prom.parse_prometheus((DATA / "vllm_metrics.txt").read_text()))
    assert vm.engine_tpot(totals) == pytest.approx(totals[vm.TPOT + "_sum"] / 3), "three requests in the scrape"
    assert vm.engine_tpot({}) is None


def test_decode_rate_counts_the_tokens_a_speculative_chunk_carries():
    from labkit.serve.client import RequestOutput

    two_per_chunk = RequestOutput(success=True, output_tokens=6, ttft_s=0.1, e2e_s=1.1, token_ids=list(range(11)))
    assert vm.decode_rate(two_per_chunk) == pytest.approx(10.0), "10 tokens after the first, in 1 s"
    assert vm.decode_rate(RequestOutput(success=True, output_tokens=11, ttft_s=0.1, e2e_s=1.1)) == pytest.approx(10.0)
    assert vm.decode_rate(RequestOutput(success=False, output_tokens=11, ttft_s=0.1, e2e_s=1.1)) is None
    assert vm.decode_rate(RequestOutput(success=True, output_tokens=1, ttft_s=0.1, e2e_s=0.1)) is None


def test_servers_started_together_are_all_stopped_and_a_failed_start_stops_the_others(tmp_path, monkeypatch, alarm):
    pids = tmp_path / "pids"
    monkeypatch.setenv("FAKE_PIDS", str(pids))
    monkeypatch.setenv("FAKE_METRICS", str(DATA / "vllm_metrics.txt"))
    monkeypatch.setattr(vs, "LOG_DIR", tmp_path)
    good = _fake_python(tmp_path / "good", SERVES)
    bad = _fake_python(tmp_path / "bad", "import sys\nprint('RuntimeError: no engine', flush=True)\nsys.exit(3)\n")
    monkeypatch.setattr(vs, "check_memory", lambda gib: None)
    named = {"a": vs.Settings(model="/m"), "b": vs.Settings(model="/m", max_num_batched_tokens=128)}
    monkeypatch.setenv("LABKIT_VLLM_PYTHON", str(good))
    with vs.started_together(named, deadline_s=30) as servers:
        assert set(servers) == {"a", "b"} and all(s.alive() for s in servers.values())
        assert servers["a"].port != servers["b"].port
        leaders = [s.proc.pid for s in servers.values()]
    assert all(gone(pid) for pid in leaders) and not [c for c in processes._LIVE if isinstance(c, vs.VLLMServer)]

    started = []
    real_start = vs.start
    def start(s, port, *args):  # "b" fails to start; "a" starts
        if s.max_num_batched_tokens == 128:
            return real_start(s, port, bad, 30, tmp_path, "b")
        started.append(real_start(s, port, good, 30, tmp_path, "a"))
        return started[-1]
    monkeypatch.setattr(vs, "start", start)
    with pytest.raises(vs.VLLMStartError, match="no engine"):
        with vs.started_together(named, deadline_s=30):
            pytest.fail("the block must not run when a server failed to start")
    assert started and gone(started[0].proc.pid) and not [c for c in processes._LIVE if isinstance(c, vs.VLLMServer)], "the server that did start is stopped"


def test_the_log_is_plain_text_also_when_started_from_a_notebook():
    # ipykernel sets FORCE_COLOR: vLLM would write ANSI colour codes into the log the parsers above read
    child = vs.environment(vs.Settings(model="/m"), base={"FORCE_COLOR": "1"})
    assert child["VLLM_LOGGING_COLOR"] == "0"


def test_pd_itl_rounds_pair_each_rounds_stall_after_a_warm_up(servers):
    """Notebook 12's burst rounds: one server that stalls the streams for a whole prefill against one that chunks
    it, six rounds after a warm-up burst each: one stall per round at its index, judged paired."""
    from labkit.lessons.nb12 import runs as nb12_runs

    plain, split = servers(Fake(prefill_s=0.3, chunks=1)), servers(Fake(prefill_s=0.3, chunks=6))
    rows = {r["target"]: r for r in nb12_runs.itl_rounds({"plain": plain.url, "split": split.url}, [[1] * 10, [2] * 10],
                                                          20, [3] * LONG, n_long=1, n_rounds=6)}
    assert len(rows["split"]["samples"]["stall_s"]) == 6 and rows["plain"]["verdict"] == "baseline"
    assert rows["split"]["verdict"] == "better" and "paired sign-flip test, 6 pairs" in rows["split"]["verdict_reason"]
    few = {r["target"]: r for r in nb12_runs.itl_rounds({"plain": plain.url, "split": split.url}, [[1] * 10, [2] * 10],
                                                         20, [3] * LONG, n_long=1, n_rounds=3)}
    assert few["split"]["verdict"] == "no verdict (3 pairs)"
