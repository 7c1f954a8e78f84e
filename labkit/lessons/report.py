"""The capstone report: a before/after table, the highest concurrency that meets an SLO, a shareable
HTML + JSON pair, and the "class results": several learners' files merged into one comparison.

The JSON is a ``labkit.core.results`` file (rows plus the environment that produced them); the HTML is
self-contained (tables, plotly figures with plotly.js embedded, provenance), so it opens offline.
"""
from __future__ import annotations

import contextlib
import html
import os
import statistics
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ..core import config, cpu, env, memory, results, timing
from ..decoding import quality
from ..model import models
from ..model.prompts import cycle
from ..serve import decoder, loadgen
from ..serve import metrics as prom
from ..serve import processes
from ..serve import shared as room
from ..serve.vllm import server as vs

CONFIG_SECTION = "configs"  # one row per served configuration, all under the same load
SWEEP_SECTION = "slo_sweep"  # one row per (configuration, concurrency)
# the figures a before/after table compares: name → (label, higher is better)
COMPARED: dict[str, tuple[str, bool]] = {
    "request_throughput": ("requests/s", True),
    "output_tokens_per_s": ("output tokens/s", True),
    "e2e_mean_s": ("mean latency (s)", False),
    "e2e_p90_s": ("p90 latency (s)", False),  # p90: a capstone run has tens of requests, too few for a p99
    "ttft_p90_s": ("p90 TTFT (s)", False),
    "peak_rss_bytes": ("peak memory, process RSS (bytes)", False),
    "max_concurrency_meeting_slo": ("highest concurrency meeting the SLO", True),
}


# ------------------------------------------------------------------------------------------- memory


# ----------------------------------------------------------------------------------- SLO and tables


def meets(row: dict[str, Any], min_good_fraction: float = 0.9) -> bool:
    """A load point meets the SLO when every request completed and at least ``min_good_fraction`` of them
    met it (``good_requests`` from ``labkit.serve.loadgen``'s summary)."""
    if not 0 < min_good_fraction <= 1:
        raise ValueError(f"min_good_fraction={min_good_fraction}: must lie in (0, 1]")
    done = row.get("completed") or 0
    return bool(done) and not row.get("failed") and (row.get("good_requests") or 0) >= min_good_fraction * done


def max_concurrency(rows: Sequence[dict[str, Any]], min_good_fraction: float = 0.9) -> int | None:
    """The highest ``concurrency`` among rows that meet the SLO (None when none does)."""
    ok = [int(r["concurrency"]) for r in rows if meets(r, min_good_fraction)]
    return max(ok) if ok else None


def before_after(before: dict[str, Any], after: dict[str, Any], metrics: dict[str, tuple[str, bool]] | None = None):
    """The before/after table: one row per figure, both values, and the change (after ÷ before, and
    whether it is better)."""
    import pandas as pd

    rows = []
    for key, (label, higher_better) in (metrics or COMPARED).items():
        b, a = before.get(key), after.get(key)
        ratio = a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
        better = None if ratio is None else (ratio > 1) == higher_better and ratio != 1
        rows.append({"figure": label, "key": key, "before": b, "after": a, "after / before": ratio, "better": better})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------ choosing a precision


def pick_precision(rows: Sequence[dict[str, Any]], min_agreement: float) -> str:
    """The fastest row (``tokens_per_s``) whose greedy agreement with the reference is at least ``min_agreement``."""
    ok = [r for r in rows if r["agreement"] >= min_agreement]
    if not ok:
        raise ValueError(f"no precision keeps greedy agreement ≥ {min_agreement}; lower min_agreement or add fp32")
    return max(ok, key=lambda r: r["tokens_per_s"])["precision"]


def choose_precision(models_by_precision: dict[str, Any], tokenizer: Any, prompts: Sequence[str], batch: int,
                     new_tokens: int, reference: str = "fp32", min_agreement: float = 0.9, ref_prompts: int = 3,
                     ref_tokens: int = 12, repeats: int = 3) -> tuple[list[dict[str, Any]], str]:
    """Measure each precision on the serving shape and its cost in answers; return the rows and the choice.

    Speed: ``batch`` chat prompts decoded together for ``new_tokens`` each (``decoder.decode_batch``, the
    servers' own loop, prefill included), after one untimed warmup batch each, in ``repeats`` interleaved rounds
    (fp32 bf16 fp16 fp32 …: a slowdown hits each alike); each row keeps its ``samples`` of tokens/s for the
    verdicts and its median as ``tokens_per_s``. Quality: greedy agreement and KL against ``reference`` on
    ``ref_prompts`` prompts. The choice is the fastest precision whose agreement is at least ``min_agreement``
    (``pick_precision``), so a faster precision that changes answers loses.
    """
    if reference not in models_by_precision:
        raise ValueError(f"reference precision {reference!r} is not among {list(models_by_precision)}")
    if batch < 1 or new_tokens < 1 or repeats < 1:
        raise ValueError(f"batch={batch}, new_tokens={new_tokens}, repeats={repeats}: each must be at least 1")
    ids = [models.chat_inputs(tokenizer, p)["input_ids"][0].tolist() for p in cycle(prompts, batch)]
    ref = quality.reference(models_by_precision[reference], tokenizer, list(prompts[:ref_prompts]), new_tokens=ref_tokens)

    def runner(model: Any, n: int) -> Callable[[], float]:
        eos = decoder.eos_ids(model, tokenizer)

        def run() -> float:
            seqs = [decoder.Sequence(prompt_ids=list(x), max_new_tokens=n, ignore_eos=True) for x in ids]
            with timing.track(model.device) as watch:
                decoder.decode_batch(model, seqs, eos, tokenizer.pad_token_id)
            return watch.seconds
        return run

    for model in models_by_precision.values():
        runner(model, 2)()  # warmup: first calls pay allocation and kernel set-up
    walls = timing.rounds({name: runner(model, new_tokens) for name, model in models_by_precision.items()}, repeats,
                          again=False)
    rows = []
    for name, model in models_by_precision.items():
        q = quality.compare(model, ref)
        rates = [batch * new_tokens / w for w in walls[name]]
        rows.append({"precision": name, "batch": batch, "new_tokens": new_tokens, "rounds": repeats,
                     "seconds": statistics.median(walls[name]), "tokens_per_s": statistics.median(rates),
                     "agreement": q.agreement, "kl": q.kl, "samples": {"tokens_per_s": rates}})
    return rows, pick_precision(rows, min_agreement)


# ------------------------------------------------------------------------------------- load points


def load_point(url: str, prompts: Sequence[str], concurrency: int, num_requests: int, max_tokens: int,
               slo: Any = None, endpoint: str = "chat", device: Any = None, stats: Callable[[], Any] | None = None,
               **loadgen_options: Any) -> dict[str, Any]:
    """One load test (``labkit.serve.loadgen.run``, streaming, answers end at end-of-sequence or ``max_tokens``)
    at ``concurrency`` clients, with the process's peak RSS (sampled) and the CUDA allocator peak of ``device``,
    the server's (default: the device notebooks use, ``env.device()``; "cuda:1" reads GPU 1, not the current one).

    ``stats``: the server's metrics snapshot (``ServerHandle.stats``); read after loadgen's warm-up and after the
    run, its difference gives the row's ``mean_batch_size`` of the measured requests alone (``metrics.mean_batch_between``)."""
    device = device if device is not None else env.device()
    before: dict[str, Any] = {}
    start = (lambda: before.update(stats())) if stats is not None else None
    with memory.track(device) as mem, memory.RSSSampler(interval_s=0.05) as rss:
        run = loadgen.run(url, prompts, num_requests=num_requests, max_concurrency=concurrency, max_tokens=max_tokens,
                          endpoint=endpoint, ignore_eos=False, slo=slo, on_start=start, **loadgen_options)
    batch = {"mean_batch_size": prom.mean_batch_between(before, stats())} if stats is not None else {}
    summary = {k: v for k, v in run.summary().items() if k not in ("errors", "slo")}
    errors = run.summary()["errors"]
    return {**summary, **batch, "concurrency": concurrency, "peak_rss_bytes": rss.peak_bytes, "peak_rss_source": rss.source,
            "samples": {"e2e_s": [o.e2e_s for o in run.outputs if o.success]},  # per request: for a verdict
            "cuda_peak_bytes": mem.cuda_peak.bytes, "cuda_peak_note": mem.cuda_peak.reason,
            "errors": "; ".join(f"{n}× {e}" for e, n in errors.items())}


def slo_from_baseline(target: Any, baseline: dict[str, Any], factor: float = 3.0) -> tuple[Any, str]:
    """The SLO a load test on this machine can use, from one request measured alone (``baseline``: a
    ``load_point`` row at concurrency 1): ``target`` when one request alone meets it, else ``factor`` × the
    baseline's median TTFT and TPOT, with a sentence saying which and why."""
    ttft, tpot = baseline.get("ttft_p50_s"), baseline.get("tpot_p50_s")
    if not ttft or not tpot:
        raise ValueError("the baseline has no TTFT/TPOT medians: did its requests complete? (see its 'errors')")
    alone = f"one request alone: TTFT {ttft:.2f} s, TPOT {tpot:.3f} s (median of {baseline.get('completed')})"
    if (target.ttft_s is None or ttft <= target.ttft_s) and (target.tpot_s is None or tpot <= target.tpot_s):
        return target, f"SLO TTFT ≤ {target.ttft_s} s, TPOT ≤ {target.tpot_s} s: reachable here ({alone})"
    slo = loadgen.SLO(ttft_s=factor * ttft, tpot_s=factor * tpot)
    return slo, (f"The target SLO (TTFT ≤ {target.ttft_s} s, TPOT ≤ {target.tpot_s} s) is unreachable here: {alone}. "
                 f"This run's SLO is {factor:g}× that: TTFT ≤ {slo.ttft_s:.2f} s, TPOT ≤ {slo.tpot_s:.3f} s")


def slo_sweep(url: str, prompts: Sequence[str], levels: Sequence[int], requests_per_client: int, max_tokens: int,
              slo: Any, min_good_fraction: float = 0.9, stop_at_first_miss: bool = True,
              **options: Any) -> list[dict[str, Any]]:
    """``load_point`` at each concurrency in ``levels`` (rising), ``requests_per_client`` × concurrency
    requests each; stops after the first level that misses the SLO (higher ones only queue longer)."""
    if not levels or sorted(levels) != list(levels):
        raise ValueError(f"levels={list(levels)}: give concurrency levels in rising order, at least one")
    rows = []
    for c in levels:
        row = load_point(url, prompts, c, requests_per_client * c, max_tokens, slo, **options)
        row["meets_slo"] = meets(row, min_good_fraction)
        rows.append(row)
        if stop_at_first_miss and not row["meets_slo"]:
            break
    return rows


# ------------------------------------------------------------------------------------------ vLLM under the same load


def group_memory(pid: int) -> tuple[int | None, str]:
    """Memory of a process group (``vllm serve``: front end, engine core, workers) and its source: the processes'
    PSS summed (Linux: a shared page counted once, split among the processes that map it, so the sum is what the
    group holds), else their USS (macOS: private pages only), else their RSS (shared pages counted in every process:
    an overcount). ``(None, reason)`` when none of its processes can be read."""
    import psutil

    totals: dict[str, int] = {}
    for member in processes.group_pids(pid):
        try:
            full = psutil.Process(member).memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for kind in ("pss", "uss", "rss"):
            if getattr(full, kind, None) is not None:
                totals[kind] = totals.get(kind, 0) + getattr(full, kind)
    for kind, words in (("pss", "PSS (shared pages counted once)"), ("uss", "USS (private pages only)"),
                        ("rss", "RSS (shared pages counted in each process)")):
        if kind in totals:
            return totals[kind], f"{words} of vllm serve's processes, summed after the run"
    return None, "no process of vllm serve's group could be read"


@contextlib.contextmanager
def _vllm(settings: Any, shared: room.SharedServer | None, deadline_s: float, name: str) -> Iterator[Any]:
    """A local ``vllm serve`` started for the block, or the room's ``shared`` one (nothing started here)."""
    if shared is not None:
        yield shared
        return
    with vs.serve(settings, deadline_s=deadline_s, name=name) as srv:
        yield srv


def vllm_load(settings: Any, prompts: Sequence[str], concurrency: int, num_requests: int, max_tokens: int, slo: Any,
              levels: Sequence[int] = (), requests_per_client: int = 2, min_good_fraction: float = 0.9,
              warmup_requests: int = 8, deadline_s: float = 300.0,
              shared: room.SharedServer | None = None) -> dict[str, Any]:
    """The capstone's load against ``vllm serve`` on one start: a warm-up, the same ``load_point`` every
    configuration gets, then the same SLO sweep over ``levels`` while the server is up. Its memory is the PSS of the
    server's processes summed after the run (``group_memory``) (vLLM allocates its KV cache at start); the lab's allocator peak does
    not apply. With ``shared`` (the room's server, ``labkit.serve.shared``) the load goes there and nothing starts
    here; its memory is not readable, and ``row["where"]`` says whose machine it was. Returns ``status`` ("ok" or the
    one line saying why vLLM did not run), ``row``, ``sweep``, ``platform``, ``start_s`` (None on a shared server)."""
    try:
        with _vllm(settings, shared, deadline_s, "vllm-capstone") as srv:
            loadgen.run(srv.url, prompts, num_requests=warmup_requests, max_concurrency=warmup_requests, max_tokens=4,
                        endpoint="chat")  # the first requests pay set-up
            row = load_point(srv.url, prompts, concurrency, num_requests, max_tokens, slo)
            memory, source = (None, room.MEMORY_NOTE) if shared else group_memory(srv.proc.pid)
            row.update(peak_rss_bytes=memory, cuda_peak_bytes=None, mean_batch_size=None, peak_rss_source=source,
                       cuda_peak_note="vLLM runs in its own processes: this process's allocator does not see it")
            if shared:
                row.update(where=shared.provenance()["where"], server_url=shared.url, served_model=shared.model)
            sweep = (slo_sweep(srv.url, prompts, levels, requests_per_client, max_tokens, slo, min_good_fraction)
                     if levels else [])
            chose, start_s = (shared.platform(), None) if shared else (srv.platform(), srv.start_s)
    except (vs.VLLMUnavailable, vs.VLLMStartError) as exc:
        return {"status": str(exc)}
    return {"status": "ok" if not row["failed"] else f"{row['failed']} request(s) failed: {row['errors']}",
            "row": row, "sweep": sweep, "platform": chose, "start_s": start_s}


SAME_LOAD_FIGURES = ("request_throughput", "output_tokens_per_s", "ttft_p50_s", "tpot_p50_s", "itl_p50_s", "e2e_p50_s",
                     "goodput")


def same_load(urls: dict[str, str], n_rounds: int, **loadgen_options: Any) -> list[dict[str, Any]]:
    """The same ``loadgen.run`` against each server in turn, ``n_rounds`` times (interleaved, so a slower
    stretch of the machine hits each alike): one row per server, each figure the median over the rounds, every
    round's value kept under ``samples``."""
    done = timing.rounds({name: (lambda url=url: loadgen.run(url, **loadgen_options).summary())
                          for name, url in urls.items()}, n_rounds, again=False)
    rows = []
    for name, runs in done.items():
        samples = {f: [r[f] for r in runs if r.get(f) is not None] for f in SAME_LOAD_FIGURES}
        rows.append({"server": name, "rounds": n_rounds, "requests": sum(r["requests"] for r in runs),
                     "failed": sum(r["failed"] for r in runs),
                     **{f: statistics.median(v) if v else None for f, v in samples.items()}, "samples": samples})
    return rows


def beside_vllm(settings: Any, urls: dict[str, str], n_rounds: int, deadline_s: float = 300.0, warmup_requests: int = 8,
                shared: room.SharedServer | None = None, **loadgen_options: Any) -> dict[str, Any]:
    """``same_load`` over the lab's servers (``urls``) and ``vllm serve`` (one start, warmed up first), or the room's
    ``shared`` server (nothing started here; its row is labelled as another machine's). Returns ``status`` ("ok" or
    the one line saying why vLLM did not run), ``rows`` and ``platform``."""
    try:
        with _vllm(settings, shared, deadline_s, "vllm-same-load") as srv:
            loadgen.run(srv.url, num_requests=warmup_requests, max_concurrency=warmup_requests, max_tokens=4)
            name = shared.label if shared else f"vllm serve (max_num_seqs {settings.max_num_seqs})"
            rows = same_load({**urls, name: srv.url}, n_rounds, **loadgen_options)
            chose = shared.platform() if shared else srv.platform()
    except (vs.VLLMUnavailable, vs.VLLMStartError) as exc:
        return {"status": str(exc)}
    failed = sum(r["failed"] for r in rows)
    return {"status": "ok" if not failed else f"{failed} request(s) failed", "rows": rows, "platform": chose}


def show_reference(name: str, section: str, columns: Sequence[str], keep: Any = None) -> int:
    """For a measurement that could not run here: the rows of ``section`` in data/reference/<name>.json (those
    ``keep(row)`` accepts), under the line saying where, when and how they were measured, with vLLM's version where
    the reference recorded it; one line when no reference holds them. Returns how many rows were shown."""
    from IPython.display import display
    import pandas as pd

    path = results.reference_dir() / f"{name}.json"
    ref = results.reference(name) if path.is_file() else None
    rows = [r for r in (ref.section(section) if ref else []) if keep is None or keep(r)]
    if not rows:
        print(f"No reference of it ships yet (data/reference/{name}.json, section {section!r})"
              + ("." if config.platform() in config.HOSTED else
                 f": `make vllm`, then `make reference NOTEBOOKS={name.split('_')[0]}`."))
        return 0
    vllm_version = (ref.notes.get("vllm") or {}).get("platform", {}).get("version")
    print("Reference, measured elsewhere:", results.section_provenance(ref, section)
          + (f"; vLLM {vllm_version}" if vllm_version else ""))
    frame = pd.DataFrame(rows)
    display(frame[[c for c in columns if c in frame]].round(3))
    return len(rows)


# ------------------------------------------------------------------------------------------ writing


def _label(e: dict[str, Any]) -> str:
    hw = e.get("hardware", {}) or {}
    where = cpu.machine_line(hw)  # one CPU name covers several families: the ISA tells them apart
    cores = hw.get("cpu_cores_logical")
    if not hw.get("gpu") and cores:
        where += f", {cores} cores"
    return f"{where}, {str(e.get('date', '?'))[:10]}"


def to_html(res: results.Results, figures: Sequence[Any] = (), title: str | None = None,
            sections: Sequence[str] | None = None) -> str:
    """A self-contained HTML page: title, provenance, each section's table, then the figures."""
    title = title or f"labkit report: {res.name}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em}"
             "table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 8px}"
             "th{background:#f3f3f3}.prov{color:#555;font-size:13px}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             f"<p class='prov'>{html.escape(results.provenance(res) if res.env else res.name)}</p>"]
    for key, value in res.notes.items():
        parts.append(f"<p><b>{html.escape(str(key))}</b>: {html.escape(str(value))}</p>")
    names = sections if sections is not None else list(dict.fromkeys(r.get("section") for r in res.rows))
    for name in names:
        df = res.frame(name)
        if df.empty:
            continue
        df = df[[c for c in df.columns if not isinstance(df[c].iloc[0], (list, dict))]]
        parts.append(f"<h2>{html.escape(str(name))}</h2>" + df.to_html(index=False, na_rep="—", float_format="{:.4g}".format))
    for i, fig in enumerate(figures):
        parts.append(fig.to_html(full_html=False, include_plotlyjs="inline" if i == 0 else False))
    hw = res.env.get("versions", {})
    parts.append(f"<p class='prov'>versions: {html.escape(', '.join(f'{k} {v}' for k, v in hw.items() if v))}</p>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write(res: results.Results, figures: Sequence[Any] = (), out_dir: str | Path | None = None,
          title: str | None = None) -> dict[str, Path]:
    """Save ``res`` as ``<out_dir>/<name>.json`` (labkit results format) and ``<name>.html``; default
    out_dir is ``results/``. Both written atomically."""
    import tempfile

    out = Path(out_dir) if out_dir is not None else config.results_dir()
    out.mkdir(parents=True, exist_ok=True)
    json_path = res.save(out / f"{res.name}.json")  # captures the environment if not yet done
    page = to_html(res, figures, title)
    html_path = out / f"{res.name}.html"
    fd, tmp = tempfile.mkstemp(prefix=f".{html_path.name}.", dir=out)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(page)
        os.replace(tmp, html_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return {"json": json_path, "html": html_path}


# ------------------------------------------------------------------------------------- class results


def merge(paths: Sequence[str | Path], section: str = CONFIG_SECTION):
    """Several learners' result files → one DataFrame: a row per (file, configuration) of ``section``, with
    who measured it where (``learner``: the file's folder and name, ``hardware``, ``device``, ``date``)."""
    import pandas as pd

    if not paths:
        raise ValueError("no result files: pass at least one path")
    frames = []
    for p in paths:
        path = Path(p)
        try:
            res = results.load(path)
        except FileNotFoundError:
            raise ValueError(f"{path}: no such results file; pass paths of results/*.json files") from None
        rows = res.section(section)
        if not rows:
            have = sorted({r.get("section") for r in res.rows})
            raise ValueError(f"{path}: no rows in section {section!r}; it has {have}")
        df = pd.DataFrame(rows).drop(columns=["section"])
        df.insert(0, "learner", f"{path.parent.name}/{path.stem}")
        df.insert(1, "hardware", _label(res.env))
        df.insert(2, "device", res.env.get("device"))
        df.insert(3, "quick", res.env.get("quick"))
        df.insert(4, "mode", results.mode(res))
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def merge_figure(df: Any, metric: str = "request_throughput", by: str = "config",
                 title: str = "Class results: the same load on everyone's machine"):
    """Grouped bars: ``metric`` for each configuration, one colour per learner's file; files of different modes
    (quick or full, other token counts: ``results.mode``) in separate panels, each with its own axis."""
    import plotly.express as px

    if metric not in df.columns:
        raise ValueError(f"no column {metric!r}; choose one of {sorted(c for c in df.columns if df[c].dtype.kind == 'f')}")
    df = df.assign(who=df["learner"] + " · " + df["hardware"])
    split = "mode" in df.columns and df["mode"].nunique() > 1  # quick and full runs never share an axis
    fig = px.bar(df, x=by, y=metric, color="who", barmode="group", title=title, text_auto=".3g",
                 facet_col="mode" if split else None)
    fig.update_layout(yaxis_title=COMPARED.get(metric, (metric,))[0], template="plotly_white", legend_title="")
    if split:
        fig.update_yaxes(matches=None, showticklabels=True)
    return fig
