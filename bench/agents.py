"""Notebook 13's headline figures, measured in one run: an agent trace's prefix-cache economics.

    trace      the seeded trace (sessions × turns, rendered with the tool template) replayed clean and with a timestamp
               in the system prompt on the lab's server and on `vllm serve --enable-prefix-caching` (one start):
               cached share of prompt tokens (usage.prompt_tokens_details), TTFT per prompt token, busted ÷ clean
    tier       the lab's prefix cache with a disk tier: reload against recompute TTFT at several lengths, interleaved;
               the crossover predicted from the KV formula's bytes per token, the disk's read-back bandwidth and the
               prefill speed, and the measured one
    resident   sessions a KV budget keeps whole, predicted by the sizing arithmetic
    tools      N requests per tool_choice (auto, required, named) on vLLM's hermes parser: where calls land, conformance

Prints one JSON line per section, the last line one JSON document with every headline figure and its provenance.
Needs `make vllm` for the vLLM rows (skipped, and said so, without it). LABKIT_QUICK=1 shrinks the trace.

    python -m bench.agents
"""
from __future__ import annotations

import contextlib
import json
import tempfile

from labkit.core import config, cpu, env, machine
from labkit.core.results import jsonable
from labkit.lessons.nb13 import runs as nb13_runs
from labkit.model import models, prompts, sizing
from labkit.serve import launch
from labkit.serve.agents import tiers, toolcalls, trace
from labkit.serve.vllm import server as vs

MAX_TOKENS, MAX_MODEL_LEN = 2, 4096


def _emit(section: str, row: dict) -> None:
    print(json.dumps(jsonable({"section": section, **row})), flush=True)


def _busted(urls: dict, runs: dict, *, model: str | None = None, salt: bool = False, flush=None) -> dict:
    """The runs of the trace replayed side by side, request by request in shuffled rounds (``replay_rounds``), each
    on its own server (``urls``: run → URL) or under its own cache_salt: the cached shares and the paired verdict on
    TTFT per prompt token, timestamped against clean."""
    rows = nb13_runs.replay_rounds(runs, urls, max_tokens=MAX_TOKENS, model=model, flush=flush,
                                   salts={name: f"bench-{name}" for name in runs} if salt else None)
    whole, judged = nb13_runs.busted_against_clean(rows)
    return {"cached_share_clean": whole["clean"]["cached_share"], "cached_share_busted": whole["timestamp"]["cached_share"],
            "ttft_ratio_busted_over_clean": judged.ratio, "verdict": judged.kind, "verdict_reason": judged.reason}


def main() -> None:
    sessions_n, turns = config.pick(4, 2), config.pick(8, 5)
    lm = models.load(dtype="fp32")
    tok, model_path = lm.tokenizer, str(models.resolve())
    bpt = sizing.kv_bytes_per_token(sizing.shape(model_path), "fp32")
    sessions = trace.trace(sessions_n, turns, seed=0)
    runs = {"clean": [[trace.render(b, tok) for b in s.requests] for s in sessions],
            "timestamp": [[trace.render(b, tok) for b in trace.bust(s, "timestamp").requests] for s in sessions]}
    out: dict = {"sessions": sessions_n, "turns": turns, "bytes_per_token": bpt}

    with contextlib.ExitStack() as labs:
        lab = {name: labs.enter_context(launch.run_server(lm, port=0, batching="continuous", max_batch_size=4,
                                                          prefix_cache_tokens=16384, max_prompt_tokens=MAX_MODEL_LEN))
               for name in runs}
        out["lab"] = _busted({name: srv.url for name, srv in lab.items()}, runs,
                             flush={srv.url: srv.flush_cache for srv in lab.values()})
    _emit("trace_lab", out["lab"])

    lengths = config.pick((32, 128, 512, 1024, 1536), (32, 128, 1024))
    with tempfile.TemporaryDirectory(prefix="tier-", dir=config.cache_dir()) as folder, \
            launch.run_server(lm, port=0, batching="continuous", max_batch_size=2, prefix_cache_tokens=max(lengths),
                              prefix_cache_disk_dir=folder, max_prompt_tokens=MAX_MODEL_LEN) as srv:
        disk = machine.disk_bandwidth(folder, bpt)
        tier_rows = nb13_runs.tier_rounds(srv, prompts.eval_tokens(tok), lengths, max(lengths),
                                          rounds=config.pick(8, 1), truncate=True, max_tokens=MAX_TOKENS)
    predicted = nb13_runs.tier_prediction(tier_rows, disk, bpt)
    table = nb13_runs.tier_table(tier_rows)
    out["tier"] = {"disk_bytes_per_s": disk["bytes_per_s"], "start_s": disk["start_s"], "prefill_tokens_per_s": predicted["prefill_tokens_per_s"],
                   "reload_crossover_tokens": predicted["tokens"], "reason": predicted["reason"],
                   "measured_crossover_tokens": nb13_runs.measured_crossover(table), "table": table,
                   "truncated": nb13_runs.truncated_equal(tier_rows)}
    _emit("tier", out["tier"])

    budget = config.pick(4096, 2560)
    many = [[trace.render(b, tok) for b in s.requests] for s in trace.trace(6, config.pick(6, 4), seed=1)]
    out["resident"] = {"budget_tokens": budget, "longest_session_tokens": max(len(s[-1]) for s in many),
                       "resident_sessions_predicted": tiers.resident_sessions(budget * bpt, bpt,
                                                                              max(len(s[-1]) for s in many))}
    _emit("resident", out["resident"])

    if vs.vllm_python().exists():
        with contextlib.ExitStack() as stack:
            template = config.cache_dir() / "tool_template.jinja"
            template.write_text(trace.TOOL_TEMPLATE)
            block = 128 if vs.default_device() == "cpu" else 16
            srv = stack.enter_context(vs.serve(vs.Settings(
                model=model_path, device=vs.default_device(), max_num_seqs=20, max_model_len=MAX_MODEL_LEN,
                block_size=block, extra_args=("--enable-prompt-tokens-details", "--enable-auto-tool-choice",
                                              "--tool-call-parser", "hermes", "--chat-template", str(template)))))
            out["vllm"] = _busted(dict.fromkeys(runs, srv.url), runs, model=model_path, salt=True)
            _emit("trace_vllm", out["vllm"])
            first = [s.requests[0] for s in trace.trace(20, 1, seed=2)]
            table = toolcalls.table(nb13_runs.tool_runs(srv.url, first, config.pick(128, 96), model=model_path),
                                    trace.TOOLS)
            out["tool_call_conformance"] = {r["tool_choice"]: r for r in table}
            _emit("tools", out["tool_call_conformance"])
            out["vllm_version"] = srv.version()
    else:
        out["vllm"] = out["tool_call_conformance"] = None
        _emit("vllm", {"skipped": vs.MISSING})

    headline = {"cached_share_clean": out["lab"]["cached_share_clean"],
                "cached_share_busted": out["lab"]["cached_share_busted"],
                "ttft_ratio_busted_over_clean": out["lab"]["ttft_ratio_busted_over_clean"],
                "reload_crossover_tokens": out["tier"]["reload_crossover_tokens"],
                "resident_sessions_predicted": out["resident"]["resident_sessions_predicted"],
                "tool_call_conformance": ({c: r["conforming_share"] for c, r in out["tool_call_conformance"].items()}
                                          if out["tool_call_conformance"] else None),
                "vllm": ({k: out["vllm"][k] for k in ("cached_share_clean", "cached_share_busted",
                                                        "ttft_ratio_busted_over_clean")} if out["vllm"] else None),
                "provenance": {"machine": f"{cpu.cpu_name()} ({' '.join(cpu.cpu_isa())})", "quick": config.quick(),
                               "versions": env.versions(("torch", "transformers")), "vllm": out.get("vllm_version"),
                               "command": "python -m bench.agents"},
                "details": out}
    print(json.dumps(jsonable(headline)))


if __name__ == "__main__":
    main()
