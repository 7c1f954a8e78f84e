"""labkit.serve.vllm.disagg without vLLM: the routing decision, the proxy against fake prefill and decode servers
(small aiohttp apps that answer canned completions and event streams, fail, hang or are gone), the bytes on disk
against the formula, and the connector's evidence in a log and a scrape."""
from __future__ import annotations

import asyncio
import json
import struct
import time
from pathlib import Path

import pytest
import urllib.error
import urllib.request

from labkit.model import sizing
from labkit.serve import client, launch
from labkit.lessons.nb12 import runs as nb12_runs
from labkit.serve.fleet import pd_proxy
from labkit.serve.metrics import metrics_delta, parse_prometheus
from labkit.serve.processes import free_port
from labkit.serve.vllm import disagg
from labkit.serve.vllm import server as vs

pytest.importorskip("aiohttp")

LONG, SHORT = list(range(1, 201)), list(range(1, 21))  # 200 and 20 token ids; the threshold is 130


class Fake:
    """An OpenAI-style completions server: ``mode`` "ok" answers ``n`` tokens (an event stream when asked), "fail"
    answers 500, "hang" never answers, "cut" closes the stream after two chunks. Every body it got is kept."""

    def __init__(self, name: str, mode: str = "ok", n: int = 5, delay_s: float = 0.0) -> None:
        self.name, self.mode, self.n, self.delay_s, self.bodies = name, mode, n, delay_s, []

    def app(self):
        from aiohttp import web

        async def completions(request):
            body = await request.json()
            self.bodies.append(body)
            if self.mode == "fail":
                return web.json_response({"error": {"message": "boom"}}, status=500)
            if self.mode == "hang":
                await asyncio.sleep(60)
            n = min(body.get("max_tokens", self.n), self.n)
            usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": n,
                     "prompt_tokens_details": {"cached_tokens": 128 if self.name == "decode" else 0}}
            if not body.get("stream"):
                return web.json_response({"choices": [{"text": "x" * n, "token_ids": list(range(n))}], "usage": usage})
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for i in range(n):
                if self.mode == "cut" and i == 2:
                    request.transport.close()
                    return resp
                await asyncio.sleep(self.delay_s)
                chunk = {"choices": [{"text": f"t{i}", "token_ids": [i]}]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
            return resp

        async def models(_request):
            return web.json_response({"data": [{"id": "fake-model"}]})

        async def tokenize(request):
            return web.json_response({"count": len((await request.json())["prompt"].split())})

        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/tokenize", tokenize)
        return app


@pytest.fixture
def servers():
    """A fake prefill and a fake decode server, up for the test."""
    fakes = {"prefill": Fake("prefill"), "decode": Fake("decode")}
    apps = {name: launch.BackgroundApp(f.app) for name, f in fakes.items()}
    yield fakes, {name: a.url for name, a in apps.items()}
    for a in apps.values():
        a.stop()


def post(url, body, timeout=20):
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def dead_url():
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


# ---------------------------------------------------------------------------------------- the decision


@pytest.mark.parametrize("tokens,up,route", [(200, True, ["prefill", "decode"]), (130, True, ["prefill", "decode"]),
                                             (129, True, ["decode"]), (20, True, ["decode"]), (200, False, ["decode"])])
def test_plan_splits_long_prompts_only_while_the_prefill_server_is_up(tokens, up, route):
    assert disagg.plan(tokens, 130, up) == route


def test_the_kv_goes_over_in_whole_blocks_and_not_when_the_lookup_is_a_block_short():
    assert disagg.min_split_tokens(128) == 130
    assert disagg.loaded_tokens(130) == 128 and disagg.loaded_tokens(200) == 128 and disagg.loaded_tokens(300) == 256
    assert disagg.loaded_tokens(129) == 0, "stored 128, looked up 0: the decode server recomputes"
    assert disagg.loaded_tokens(257) == 0 and disagg.loaded_tokens(100) == 0


def test_connector_settings_give_each_server_its_role_folder_and_core(tmp_path):
    base = vs.Settings(model="m", extra_args=("--seed", "0"))
    two = disagg.connector_settings(base, "split", tmp_path, ("1", "0"))
    for name, role, core in (("prefill", "kv_producer", "1"), ("decode", "kv_consumer", "0")):
        s = two[name]
        assert s.cpu_cores == core and s.extra_args[:2] == ("--seed", "0")
        cfg = json.loads(s.extra_args[s.extra_args.index("--kv-transfer-config") + 1])
        assert cfg == {"kv_connector": "ExampleConnector", "kv_role": role,
                       "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)}}
        assert "--kv-transfer-config" in vs.command(s, 8000, Path("/py"))
    both = disagg.connector_settings(base, "both", tmp_path)
    assert {json.loads(s.extra_args[3])["kv_role"] for s in both.values()} == {"kv_both"}
    with pytest.raises(ValueError, match="choose one of"):
        disagg.connector_settings(base, "producer", tmp_path)


# ---------------------------------------------------------------------------------------- the proxy


def test_a_split_prefills_one_token_then_sends_the_whole_request_to_decode(servers):
    fakes, urls = servers
    with pd_proxy.proxy(urls["prefill"], urls["decode"], 130) as p:
        status, text = post(p.url, {"prompt": LONG, "max_tokens": 4, "temperature": 0.0})
    assert status == 200 and json.loads(text)["choices"][0]["token_ids"] == [0, 1, 2, 3]
    assert fakes["prefill"].bodies == [{"prompt": LONG, "max_tokens": 1, "temperature": 0.0, "stream": False}]
    assert fakes["decode"].bodies == [{"prompt": LONG, "max_tokens": 4, "temperature": 0.0}], "the request as sent"
    rec = p.records[0]
    assert rec["route"] == "split" and rec["prefill_s"] > 0 and rec["decode_s"] > 0 and not rec["fallback"]
    assert rec["cached_tokens"] == 128 and p.fallbacks == 0


def test_a_short_prompt_skips_the_prefill_server(servers):
    fakes, urls = servers
    with pd_proxy.proxy(urls["prefill"], urls["decode"], 130) as p:
        assert post(p.url, {"prompt": SHORT, "max_tokens": 3})[0] == 200
        assert post(p.url, {"prompt": "a few words", "max_tokens": 3})[0] == 200  # counted by /tokenize: 3
    assert fakes["prefill"].bodies == [] and len(fakes["decode"].bodies) == 2
    assert [r["route"] for r in p.records] == ["decode", "decode"] and p.records[1]["prompt_tokens"] == 3


def test_the_stream_passes_through_and_the_decode_ttft_is_kept(servers):
    fakes, urls = servers
    fakes["decode"].delay_s = 0.05
    with pd_proxy.proxy(urls["prefill"], urls["decode"], 130) as p:
        body = client.payload("completions", LONG, None, 5, ignore_eos=True, return_token_ids=True)
        out = client.run_sync(lambda: _stream(p.url, body))
    assert out.success and out.token_ids == [0, 1, 2, 3, 4] and len(out.chunk_s) == 5
    assert "stream_options" not in fakes["prefill"].bodies[0] and fakes["prefill"].bodies[0]["stream"] is False
    assert fakes["decode"].bodies[0]["stream"] is True
    rec = p.records[0]
    assert rec["route"] == "split" and 0.04 < rec["decode_ttft_s"] < rec["decode_s"] and rec["cached_tokens"] == 128


async def _stream(url, body):
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        return await client.send_request(session, url + "/v1/completions", body, False, 0.0)


@pytest.mark.parametrize("mode", ["down", "fail", "hang"])
def test_a_failed_prefill_goes_on_with_decode_alone_and_is_counted(servers, mode):
    fakes, urls = servers
    fakes["prefill"].mode = mode
    prefill_url = dead_url() if mode == "down" else urls["prefill"]
    with pd_proxy.proxy(prefill_url, urls["decode"], 130, prefill_timeout_s=0.5, retry_prefill_s=60) as p:
        status, text = post(p.url, {"prompt": LONG, "max_tokens": 2})
        assert status == 200 and json.loads(text)["choices"][0]["token_ids"] == [0, 1]
        assert p.fallbacks == 1 and p.records[0]["fallback"] and "prefill server" in p.records[0]["reason"]
        assert p.records[0]["prefill_s"] is None
        if mode == "hang":
            assert "timed out" in p.records[0]["reason"]
        assert post(p.url, {"prompt": LONG, "max_tokens": 2})[0] == 200
        assert p.records[1]["route"] == "decode" and p.fallbacks == 1, "while it is down the plan skips it"
    assert len(fakes["decode"].bodies) == 2


def test_the_prefill_server_is_tried_again_after_its_retry_window(servers):
    fakes, urls = servers
    fakes["prefill"].mode = "fail"
    with pd_proxy.proxy(urls["prefill"], urls["decode"], 130, retry_prefill_s=0.0) as p:
        post(p.url, {"prompt": LONG, "max_tokens": 2})
        fakes["prefill"].mode = "ok"
        post(p.url, {"prompt": LONG, "max_tokens": 2})
    assert [r["route"] for r in p.records] == ["split", "split"] and [r["fallback"] for r in p.records] == [True, False]


@pytest.mark.parametrize("mode", ["down", "hang", "fail"])
def test_a_failed_decode_answers_502_with_one_line_of_reason(servers, mode):
    fakes, urls = servers
    fakes["decode"].mode = mode
    decode_url = dead_url() if mode == "down" else urls["decode"]
    t0 = time.monotonic()
    with pd_proxy.proxy(urls["prefill"], decode_url, 130, timeout_s=1.0) as p:
        status, text = post(p.url, {"prompt": SHORT, "max_tokens": 2})
    reason = json.loads(text)["error"]["message"]
    assert status == 502 and "decode server" in reason and "\n" not in reason and time.monotonic() - t0 < 10
    assert p.records[0]["status"] == 502 and ("timed out" in reason) == (mode == "hang")
    assert ("answered 500: " in reason) == (mode == "fail")


def test_a_decode_stream_cut_off_reaches_the_client_as_a_failed_request(servers):
    fakes, urls = servers
    fakes["decode"].mode = "cut"
    with pd_proxy.proxy(urls["prefill"], urls["decode"], 130) as p:
        body = client.payload("completions", SHORT, None, 5, ignore_eos=True)
        out = client.run_sync(lambda: _stream(p.url, body))
    assert not out.success and out.error and len(out.chunk_s) == 2


def test_a_plan_that_returns_nonsense_is_named():
    with pd_proxy.proxy(dead_url(), dead_url(), 130, decide=lambda n, t, up: ["decode", "prefill"]) as p:
        status, text = post(p.url, {"prompt": SHORT, "max_tokens": 2})
    assert status == 500 and "return ['prefill', 'decode'] or ['decode']" in text
    with pd_proxy.proxy(dead_url(), dead_url(), 130) as p:
        status, text = post(p.url, {"prompt": {"not": "a prompt"}})
    assert status == 400 and "string or a list of token ids" in text
    with pd_proxy.proxy(dead_url(), dead_url(), 130) as p:
        status, text = post(p.url, {"prompt": [1000], "max_tokens": 2})
    assert status == 400 and "send 2 or more" in text, "a one-token prompt would kill the decode server's engine"


def test_the_proxy_refuses_a_request_without_deadline():
    with pytest.raises(ValueError, match="deadline"):
        pd_proxy.Proxy("http://a", "http://b", 130, timeout_s=0)
    with pytest.raises(ValueError, match="threshold"):
        pd_proxy.Proxy("http://a", "http://b", 0)


def test_the_summary_counts_routes_and_fallbacks(servers):
    fakes, urls = servers
    with pd_proxy.proxy(urls["prefill"], urls["decode"], 130) as p:
        post(p.url, {"prompt": LONG, "max_tokens": 2})
        post(p.url, {"prompt": SHORT, "max_tokens": 2})
    s = p.summary()
    assert (s["requests"], s["split_requests"], s["decode_requests"], s["fallbacks"]) == (2, 1, 1, 0)
    assert s["split_prefill_s_p50"] > 0 and s["decode_prefill_s_p50"] is None


# ---------------------------------------------------------------------------------------- bytes on disk


SMOLLM2 = sizing.ModelShape(name="SmolLM2-135M", n_params=134_515_008, quantizable_params=0, quantizable_rows=0,
                            n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, hidden_size=576, vocab_size=49152,
                            max_position_embeddings=8192)


def write_layer(path: Path, tokens: int, header_pad: int = 0) -> None:
    header = json.dumps({"kv_cache": {"dtype": "F32", "shape": [tokens, 2, 3, 64],
                                      "data_offsets": [0, tokens * 2 * 3 * 64 * 4]}}) + " " * header_pad
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(tokens * 2 * 3 * 64 * 4))


def test_the_formula_matches_the_measured_layer_file():
    per_layer = disagg.kv_bytes_formula(SMOLLM2, 128, 4)
    assert len(per_layer) == 30 and set(per_layer) == {196_696 - 88}
    assert disagg.kv_bytes_formula(SMOLLM2, 128, "float32") == per_layer
    assert disagg.kv_bytes_formula(SMOLLM2, 128, "bf16")[0] == 98_304
    with pytest.raises(ValueError, match="bytes per value"):
        disagg.kv_bytes_formula(SMOLLM2, 128, 0)


def test_kv_files_reads_each_request_folder_in_layer_order(tmp_path):
    (tmp_path / "aa").mkdir()
    for i in (0, 1, 10, 2):
        write_layer(tmp_path / "aa" / f"model.layers.{i}.self_attn.attn.safetensors", 128)
    (tmp_path / "bb").mkdir()
    write_layer(tmp_path / "bb" / "model.layers.0.self_attn.attn.safetensors", 0)
    rows = disagg.kv_files(tmp_path)
    assert [r["folder"] for r in rows] == ["aa", "bb"]
    a = rows[0]
    assert a["layers"] == 4 and a["tokens"] == 128 and a["dtype"] == "F32" and a["shape"] == [128, 2, 3, 64]
    head = a["header_bytes"][0]
    assert a["per_layer_bytes"] == [head + 196_608] * 4 and a["payload_bytes"] == 4 * 196_608
    assert a["per_layer_bytes"][0] - head == disagg.kv_bytes_formula(SMOLLM2, a["tokens"], 4)[0]
    assert rows[1]["tokens"] == 0 and rows[1]["payload_bytes"] == 0, "a prompt under one block: an empty folder's files"
    with pytest.raises(ValueError, match="shared_storage_path"):
        disagg.kv_files(tmp_path / "missing")


# ---------------------------------------------------------------------------------------- loaded or recomputed


HIT_LOG = """(EngineCore pid=1) INFO 05-01 10:00:01 [example_connector.py:296] External Cache Hit!
(EngineCore pid=1) INFO 05-01 10:00:01 [example_connector.py:171] Inject KV cache of 128 tokens to the paged memory
"""
EMPTY_HIT = "(EngineCore pid=1) INFO 05-01 10:00:02 [example_connector.py:296] External Cache Hit!\n"


def test_the_log_tells_a_load_from_a_recompute():
    assert disagg.kv_log(HIT_LOG) == {"hits": 1, "injected_tokens": [128]}
    assert not disagg.recomputed(HIT_LOG)
    assert disagg.recomputed("(APIServer pid=1) INFO ... POST /v1/completions HTTP/1.1 200\n"), "no line: recomputed"
    assert disagg.recomputed(EMPTY_HIT), "a hit on the zero-token folder loads nothing"


def test_transfer_metrics_take_the_connector_counters_apart_by_source():
    def scrape(hits, queries, external, local):
        return parse_prometheus(
            f'vllm:external_prefix_cache_hits_total{{engine="0",model_name="m"}} {hits}\n'
            f'vllm:external_prefix_cache_queries_total{{engine="0",model_name="m"}} {queries}\n'
            f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="external_kv_transfer"}} {external}\n'
            f'vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="local_compute"}} {local}\n')
    before, after = disagg.transfer_metrics(scrape(0, 200, 0, 200)), disagg.transfer_metrics(scrape(128, 400, 128, 272))
    delta = metrics_delta(before, after)
    assert delta[disagg.EXTERNAL_HITS] == 128 and delta[disagg.EXTERNAL_QUERIES] == 200
    assert delta["prompt_tokens_external_kv_transfer_total"] == 128 and delta["prompt_tokens_local_compute_total"] == 72


# ---------------------------------------------------------------------------------------- ITL rows


def test_itl_rounds_judge_each_target_against_the_first(servers):
    fakes, urls = servers
    fakes["decode"].delay_s, fakes["prefill"].delay_s = 0.01, 0.03  # "prefill" plays the slower server here
    rows = nb12_runs.itl_rounds({"one": urls["prefill"], "split": urls["decode"]}, [SHORT, SHORT], 5, LONG, n_long=2,
                               n_rounds=6, long_after=2)  # six pairs: the fewest a paired verdict judges
    by = {r["target"]: r for r in rows}
    assert by["one"]["verdict"] == "baseline" and len(by["split"]["samples"]["stall_s"]) == 6
    assert by["split"]["stall_p50_s"] < by["one"]["stall_p50_s"]
    assert by["split"]["verdict"] == "better" and by["split"]["gain"] > 1, by["split"]["verdict_reason"]
    assert by["one"]["errors"] == [] and by["split"]["answers"] == [[0, 1, 2, 3, 4]] * 2
    longs = [b["prompt"] for b in fakes["decode"].bodies if b["max_tokens"] == 1]
    assert len(longs) == (6 + 1) * 2 and len({tuple(p) for p in longs}) == len(longs), "every long prompt is new"  # 6 rounds, 1 warm-up burst
    with pytest.raises(ValueError, match="still decoding"):
        client.burst(urls["decode"], [SHORT], 3, [LONG], after=3)


def test_a_burst_is_one_record_its_callers_read():
    streams = (client.RequestOutput(success=True, chunk_s=[0.1, 0.2], token_ids=[1, 2]),)
    answered = client.RequestOutput(success=True, chunk_s=[0.5, 0.6])
    failed = client.RequestOutput(success=False, error="503 queue full")
    got = client.Burst(streams, (answered, failed), 0.15)
    assert got.stamps == [[0.1, 0.2]] and got.answers == [[1, 2]] and got.errors == ["503 queue full"]
    assert got.first_token_s is None, "a burst request that sent no token leaves the prefill's end unknown"
    assert client.Burst(streams, (answered,), 0.15).first_token_s == 0.5
    with pytest.raises(AttributeError):
        got.sent_s = 1.0  # frozen: one run's record
