"""Notebook 12's headline figures, measured in one run: structured outputs, multi-LoRA, prefill/decode split.

    structured  8 "give JSON" requests at once, free against constrained (response_format json_schema), interleaved
                rounds, on the lab's server (xgrammar) and on `vllm serve` (its default backend, xgrammar): valid
                answers, tokens per answer, tokens/s per sequence and the batch's wall time, each with its verdict
    lora        one `vllm serve --enable-lora` with two adapters made here: tokens/s of the base, one adapter and both
                mixed in one batch (interleaved rounds, verdicts against the base); greedy answers against
                transformers with each adapter merged
    pd          prefill (core 1) and decode (core 0) with vLLM's ExampleConnector behind the lab's proxy, beside one
                plain server on every core: tokens identical, KV bytes per layer against the sizing formula, the
                short streams' longest stall under a burst of long prompts (split ÷ plain, verdict)

Prints one JSON line per section, the last line one JSON document with every headline figure. Needs `make vllm` for
lora and pd (skipped, and said so, without it). LABKIT_QUICK=1 shrinks rounds and prompts.

    python -m bench.serving_features [--skip pd]
"""
from __future__ import annotations

import argparse
import json
import tempfile

from labkit.core import config, cpu, env
from labkit.core.results import jsonable
from labkit.lessons.nb12 import runs as nb12_runs
from labkit.model import adapters, models, prompts
from labkit.serve import launch
from labkit.serve.decoder import eos_ids
from labkit.serve.vllm import lora
from labkit.serve.vllm import server as vs

PEOPLE = ["a teacher from Lyon", "a retired sailor", "a nurse in Osaka", "a young painter", "a baker in Quebec",
          "a chess champion", "a farmer in Kenya", "a student in Lima"]
KEEP = ("variant", "valid", "requests", "valid_share", "tokens_per_answer", "tokens_per_s_per_seq", "wall_s",
        "first_wall_s", "speed_ratio", "speed_verdict", "wall_ratio", "wall_verdict")


def _emit(section: str, row: dict) -> None:
    print(json.dumps(jsonable({"section": section, **row})), flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=config.pick(8, 6),
                    help="interleaved rounds, judged paired (6 or more pairs for a verdict)")
    ap.add_argument("--skip", nargs="*", default=[], choices=("structured", "lora", "pd"), help="sections to leave out")
    args = ap.parse_args(argv)
    if args.rounds <= 0:
        ap.error("--rounds must be positive")
    head: dict = {"machine": cpu.machine_line(env.hardware()), "quick": config.quick()}
    lm = models.load(dtype="fp32")
    tok, path = lm.tokenizer, models.resolve()
    asks = [f"Give JSON with the name, age and city of {who}." for who in PEOPLE]
    variants = {"free": {}, "constrained": {"response_format": nb12_runs.json_schema_format(nb12_runs.PERSON_SCHEMA)}}
    have_vllm = vs.vllm_python().exists()
    if "structured" not in args.skip:
        with launch.start_server(lm, port=0, max_batch_size=len(asks)) as srv:
            runs = nb12_runs.structured_rounds(srv.url, asks, variants, max_tokens=64, rounds=args.rounds,
                                              schema=nb12_runs.PERSON_SCHEMA)
        for row in nb12_runs.structured_table(runs):
            _emit("structured_lab", {k: row.get(k) for k in KEEP})
            if row["variant"] == "constrained":
                head["lab_structured"] = {k: row.get(k) for k in KEEP}
    dirs = adapters.make_adapters(path, config.cache_dir() / "adapters", ["alpha", "beta"], rank=8)
    if have_vllm and ("lora" not in args.skip or "structured" not in args.skip):
        with vs.serve(vs.Settings(model=path, device=vs.default_device(), max_num_seqs=8,
                                  extra_args=lora.lora_args(dirs))) as srv:
            if "structured" not in args.skip:
                runs = nb12_runs.structured_rounds(srv.url, asks, variants, max_tokens=64, rounds=args.rounds,
                                                  schema=nb12_runs.PERSON_SCHEMA, model=path)
                for row in nb12_runs.structured_table(runs):
                    _emit("structured_vllm", {k: row.get(k) for k in KEEP})
                    if row["variant"] == "constrained":
                        head["vllm_structured"] = {k: row.get(k) for k in KEEP}
            if "lora" not in args.skip:
                ids = [list(models.chat_ids(tok, q)) for q in prompts.load_prompts()[:8]]
                checks = lora.lora_check(srv, adapters.greedy_table(path, dirs, ids[:4], 24), ids[:4], 24,
                                         eos_ids(lm.model, tok))
                modes = lora.lora_rounds(srv, ["alpha", "beta"], ids, 32, len(ids), args.rounds)
                for m in modes:
                    _emit("lora", m)
                by = {m["mode"]: m for m in modes}
                head["lora"] = {"tokens_per_s": {k: v["tokens_per_s"] for k, v in by.items()},
                                "mixed_over_base": by["mixed"]["tokens_per_s"] / by["base"]["tokens_per_s"],
                                "equal_to_merged": {n: f"{c['equal']}/{c['compared']}" for n, c in checks.items()}}
    elif not have_vllm:
        head["vllm"] = vs.MISSING
    if have_vllm and "pd" not in args.skip:
        text = prompts.eval_tokens(tok)
        storage = tempfile.mkdtemp(prefix="kv-", dir=config.cache_dir())
        base = vs.Settings(model=path, max_model_len=1024, max_num_seqs=8, prefix_caching=False)
        with vs.started_together(nb12_runs.pd_servers(base, storage), deadline_s=400) as servers:
            out = nb12_runs.pd_session(servers, storage, path, [text[300 * i:300 * i + n] for i, n in enumerate((140, 180, 260))],
                                missing_prompt=text[1200:1400], short_prompts=[text[1600:1620], text[1700:1720]],
                                long_prompt=text[2000:2500], n_long=2, burst_rounds=args.rounds, kill_prompt=text[3000:3300])
        for r in out["split"]:
            _emit("pd_split", r)
        for r in out.get("itl", []):
            _emit("pd_itl", r)
        split = next((r for r in out.get("itl", []) if r["target"] == "split"), {})
        head["pd"] = {"identical": sum(r["identical"] for r in out["split"]), "requests": len(out["split"]),
                      "bytes_over_formula": nb12_runs.bytes_ratio(out["split"]),
                      "bytes_per_request": [sum(f["bytes"] for f in r["files"]) for r in out["split"]],
                      "stall_plain_over_split": split.get("gain"), "stall_verdict": split.get("verdict"),
                      "missing_kv_recomputed": out["missing"]["recomputed"], "kill": out["kill"]}
    print(json.dumps(jsonable(head)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
