"""Notebook 14's headline figures, measured in one run: can you trust this benchmark?

    clients     labkit's loadgen, vllm bench serve, AIPerf and GuideLLM on one request set against one `vllm serve`
                (held to core 0, each client to core 1), interleaved rounds, each other client's pass between two
                passes of labkit's (the anchor): each client's own p50 TTFT, TPOT/ITL and tokens/s, the same runs under
                one definition, each client's aligned deviation from its anchor passes (median over its pairs) beside
                its pass-to-pass range, vLLM's own mean TPOT over each pass held against the anchor's likewise
                (what arose outside the server's timing: ``tpot_beyond_server``), and the largest aligned deviation from
                the clients' median
    shared      labkit's client and AIPerf again on the server's own core: CPU share, how far the figures move
    aa_ab       A/A trials and trials with a known per-token slowdown (the lab's slow proxy), interleaved passes in
                pairs, real and resampled from the recorded A/A passes: false-positive and detection rates of one run
                each, the overlap rule, a request bootstrap and the paired test (sized by the power formula)
    loops       a concurrency cap against Poisson arrivals at the same mean rate; the idle gap
    loadgen     MLPerf LoadGen Offline, then Server at 0.4 and twice the rate Offline sustained
    divergence  one prompt's greedy answer alone and inside batches: vllm serve (fp32; bf16 on a second start), the
                lab's engine fp32 and bf16

Prints one JSON line per section, the last line one JSON document with every headline figure and its provenance.
Two `vllm serve` starts (fp32, then bf16). Needs `make vllm` and `make clients` (rows marked failed, and said so,
without them). LABKIT_QUICK=1 shrinks it.

    python -m bench.trust [--trials N] [--ab-trials N] [--resampled N]   (real trials: 10 of each kind in full mode,
                                                                          2 A/A and 2 A/B in quick; 200 resampled)
"""
from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from pathlib import Path

from labkit.core import config, cpu, env
from labkit.core.results import jsonable
from labkit.lessons.nb14 import runs as nb14_runs
from labkit.model import models
from labkit.serve import loadgen, metrics, processes
from labkit.serve.experiments import paged
from labkit.serve.vllm import server as vs

SERVER_CORES, CLIENT_CORES = {0}, {1}
SLOWDOWN = 0.10


def _emit(section: str, row: dict) -> None:
    print(json.dumps(jsonable({"section": section, **row})), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=config.pick(10, 2),
                    help="real A/A trials (and A/B trials unless --ab-trials)")
    ap.add_argument("--ab-trials", type=int, default=None, help="real A/B trials (default: --trials)")
    ap.add_argument("--resampled", type=int, default=200,
                    help="A/A and slowdown trials drawn from the recorded A/A passes")
    args = ap.parse_args()
    lm = models.load(dtype="fp32")
    tok = lm.tokenizer
    model_path = str(models.resolve())
    requests = paged.load_requests()
    n, length = config.pick(16, 8), config.pick(32, 16)
    texts = [tok.apply_chat_template([{"role": "user", "content": r.prompt}], add_generation_prompt=True,
                                     tokenize=False) for r in requests[:n]]
    work = loadgen.Workload(texts, num_requests=len(texts), max_tokens=length, max_concurrency=4, model=model_path,
                            tokenizer=model_path)
    ids = [list(models.chat_ids(tok, r.prompt)) for r in requests[:12]]
    targets, batches, tokens = config.pick((0, 1, 2, 3), (0, 1)), config.pick((2, 4, 8), (2, 8)), config.pick(32, 16)
    out: dict = {"clients": None, "aa_ab": None, "loadgen": None, "divergence": {}}
    folder = Path(tempfile.mkdtemp(prefix="labkit-trust-"))
    with contextlib.ExitStack() as stack:
        srv = None
        if vs.vllm_python().exists():
            srv = stack.enter_context(vs.serve(vs.Settings(model=model_path, device=vs.default_device(), max_num_seqs=8,
                                                           cpu_cores="0")))
            processes.pin_group(srv.proc.pid, SERVER_CORES)
            out["vllm_version"] = srv.version()
        else:
            _emit("vllm", {"skipped": vs.MISSING})
        if srv is not None:
            loadgen.run(srv.url, texts[:1], num_requests=1, max_tokens=4, warmup=0, model=model_path)
            runs = nb14_runs.clients_on_one_server(srv.url, work, folder / "pinned", rounds=config.pick(7, 1),
                                                   cores=CLIENT_CORES, anchor="labkit",
                                                   scrape=lambda: metrics.scrape(srv.url))
            tables = nb14_runs.client_tables(runs)
            anchored = nb14_runs.anchored(runs)
            out["clients"] = {"raw": tables["raw"], "aligned": tables["aligned"],
                              "anchored": {name: nb14_runs.anchored_row(anchored, name) for name in runs},
                              "max_anchored_deviation": anchored["max"],
                              "anchor_waves": nb14_runs.waves(runs["labkit"], work.max_concurrency),
                              "first_waves": nb14_runs.first_waves(runs, work.max_concurrency),
                              "max_aligned_deviation": tables["aligned_deviation"]["max"],
                              "max_raw_deviation": tables["raw_deviation"]["max"]}
            _emit("clients", out["clients"])
            shared_rows, moved = nb14_runs.shared_cores(srv.url, work, folder / "shared", tables, runs,
                                                        server_cores=SERVER_CORES)
            out["shared"] = {"rows": shared_rows, "busiest_moved": moved}
            _emit("shared", out["shared"])
            ab = nb14_runs.aa_ab(srv.url, texts, model=model_path, aa_trials=args.trials,
                                 pairs=config.pick(10, 6), slowdown=SLOWDOWN, requests=config.pick(8, 4),
                                 max_tokens=config.pick(16, 8), concurrency=4, max_ab_pairs=config.pick(20, 6),
                                 ab_trials=args.trials if args.ab_trials is None else args.ab_trials,
                                 resampled=args.resampled, resamples=config.pick(1000, 200))
            out["aa_ab"] = {k: v for k, v in ab.items() if k not in ("rows", "resampled_rows", "recording")}
            out["aa_ab"]["rows"] = [{k: v for k, v in r.items() if k != "ci_s"} for r in ab["rows"]]
            _emit("aa_ab", out["aa_ab"])
            loops = nb14_runs.loops(srv.url, texts, model=model_path, requests=config.pick(32, 8), concurrency=4,
                                    max_tokens=8, long_tokens=32, idle_s=config.pick(20, 3))
            out["loops"] = {k: v for k, v in loops.items() if k not in ("closed", "open", "closed_long")} | {
                name: {k: v for k, v in loops[name].items() if k != "ttft_s"} for name in ("closed", "open",
                                                                                           "closed_long")}
            _emit("loops", out["loops"])
            lg_rows, limits = nb14_runs.loadgen_rates(srv.url, model_path, texts, folder,
                                                      tpot_s=ab["tpot_a_s"], queries=config.pick(96, 48),
                                                      tokens=8, min_duration_s=config.pick(20, 3))
            out["loadgen"] = {"limits": limits, "runs": lg_rows}
            _emit("loadgen", out["loadgen"])
            out["divergence"]["vLLM fp32"] = nb14_runs.vllm_batch_divergence(srv.url, ids, batches=batches,
                                                                             targets=targets, max_tokens=tokens)
    more, missing = nb14_runs.divergence_beside_vllm(model_path, lm.model, tok.pad_token_id, ids, batches=batches,
                                                     targets=targets, max_tokens=tokens,
                                                     vllm_bf16=vs.vllm_python().exists())  # a second start: bf16
    out["divergence"].update(more)
    if missing:
        _emit("vllm bf16", {"status": missing})
    divergence = {label: [{k: v for k, v in r.items() if k not in ("alone", "in_batch")} for r in rows]
                  for label, rows in out["divergence"].items()}
    _emit("divergence", divergence)

    clients = out["clients"]
    headline = {
        "clients": ({name: {"ttft_p50_s": a["ttft_p50_s"], "tpot_p50_s": a["tpot_p50_s"],
                            "output_tokens_per_s": a["output_tokens_per_s"]} for name, a in clients["aligned"].items()}
                    if clients else None),
        "clients_raw": ({r["client"]: {k: r.get(k) for k in ("status", "ttft_p50_s", "tpot_p50_s",
                                                            "output_tokens_per_s", "latency_named")}
                         for r in clients["raw"]} if clients else None),
        "max_aligned_deviation": clients["max_aligned_deviation"] if clients else None,
        "max_anchored_deviation": clients["max_anchored_deviation"] if clients else None,
        "clients_anchored": clients["anchored"] if clients else None,
        "max_raw_deviation": clients["max_raw_deviation"] if clients else None,
        "aa_false_positive_rate": ({k: v["aa_false_positive_rate"] for k, v in out["aa_ab"]["rates"].items()}
                                   if out["aa_ab"] else None),
        "injected_slowdown_detection": ({k: v["slowdown_detection_rate"] for k, v in out["aa_ab"]["rates"].items()}
                                        | {"slowdown_share": out["aa_ab"]["slowdown_share"]} if out["aa_ab"] else None),
        "resampled_aa_false_positive_rate": ({k: v["aa_false_positive_rate"]
                                              for k, v in out["aa_ab"]["resampled_rates"].items()}
                                             if out["aa_ab"] else None),
        "resampled_injected_slowdown_detection": ({k: v["slowdown_detection_rate"]
                                                   for k, v in out["aa_ab"]["resampled_rates"].items()}
                                                  if out["aa_ab"] else None),
        "readers_meeting_goal": ([r["reader"] for r in out["aa_ab"]["table"] if r["meets_goal"]]
                                 if out["aa_ab"] else None),
        "paired_sizing": ({k: out["aa_ab"][k] for k in ("sigma_d", "needed", "pairs", "aa_pairs", "aa_trials",
                                                        "ab_trials", "resampled_trials", "recorded_rounds",
                                                        "requests_per_pass", "tokens_per_request")}
                          if out["aa_ab"] else None),
        "loadgen": ([{"scenario": r["scenario"], "qps": r["target_qps"], "result": r.get("Result is")}
                     for r in out["loadgen"]["runs"]] if out["loadgen"] else None),
        "batch_divergence": {label: {"changed": sum(r["first_difference"] is not None for r in rows),
                                     "pairs": len(rows),
                                     "max_logit_diff": max((r["max_logit_diff"] for r in rows
                                                            if r.get("max_logit_diff") is not None), default=None)}
                             for label, rows in divergence.items()},
        "provenance": {"machine": f"{cpu.cpu_name()} ({' '.join(cpu.cpu_isa())})", "quick": config.quick(),
                       "versions": env.versions(("torch", "transformers", "mlcommons-loadgen")),
                       "vllm": out.get("vllm_version"), "clients": "aiperf 0.13.0, guidellm 0.8.1 (make clients)",
                       "command": " ".join(["python -m bench.trust", f"--trials {args.trials}",
                                            *([f"--ab-trials {args.ab_trials}"] if args.ab_trials is not None else []),
                                            f"--resampled {args.resampled}"])},
        "details": {k: v for k, v in out.items() if k != "divergence"},
    }
    print(json.dumps(jsonable(headline)))


if __name__ == "__main__":
    main()
