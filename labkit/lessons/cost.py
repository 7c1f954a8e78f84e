"""What a token costs: dollars per million output tokens from a measured throughput and an hourly price.

The prices live in ``data/prices.json`` (public on-demand list prices), one row per instance, each with the page
it was read from and that page's date: ``load_prices`` refuses a row without them, so no price reaches a
notebook unsourced. The arithmetic is one line: an instance that produces ``tokens_per_s`` for an hour costs
``hourly_usd``, so a million tokens cost ``hourly_usd / (tokens_per_s × 3600) × 10⁶``.

This module measures nothing: the throughput comes from a notebook's own run (or a reference file), the price
from the table or from the learner.
"""
from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core import config
from ..core.checks import load_rows, positive_float, row_error

KINDS = ("gpu", "cpu")
REQUIRED = ("name", "kind", "hourly_usd", "source", "date")
SECONDS_PER_HOUR = 3600


def prices_path() -> Path:
    return config.DATA_DIR / "prices.json"


def _row_error(path: Path, i: int, row: Any, problem: str) -> ValueError:
    return row_error(path, i, row, problem)


def check_row(row: Any, i: int = 0, path: Path | str = "prices") -> dict[str, Any]:
    """One price row, validated: a name, a kind (gpu|cpu), hourly_usd > 0, the source page's URL and an ISO date;
    a cpu row also names its arch (x86|arm)."""
    path = Path(path)
    if not isinstance(row, dict):
        raise _row_error(path, i, row, f"expected an object with {REQUIRED}, got {type(row).__name__}")
    if not isinstance(row.get("name"), str) or not row["name"].strip():
        raise _row_error(path, i, row, "no name: give each price a name, e.g. \"AWS g5.xlarge\"")
    if row.get("kind") not in KINDS:
        raise _row_error(path, i, row, f"kind={row.get('kind')!r}: choose one of {KINDS}")
    usd = row.get("hourly_usd")
    if isinstance(usd, bool) or not isinstance(usd, (int, float)) or not math.isfinite(usd) or usd <= 0:
        raise _row_error(path, i, row, f"hourly_usd={usd!r}: a positive number of US dollars per hour")
    source = row.get("source")
    if not isinstance(source, str) or not source.startswith(("https://", "http://")):
        raise _row_error(path, i, row, f"source={source!r}: every price needs the URL of the page it was read from")
    date = row.get("date")
    try:
        dt.date.fromisoformat(date) if isinstance(date, str) else None
    except ValueError:
        date = None
    if not isinstance(date, str):
        raise _row_error(path, i, row, f"date={row.get('date')!r}: every price needs the date it was read or "
                                       "published, as YYYY-MM-DD")
    gpus = row.get("gpus")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0):
        raise _row_error(path, i, row, f"gpus={gpus!r}: the GPUs in the instance, a positive integer")
    archs = ("x86", "arm")
    if row["kind"] == "cpu" and row.get("arch") not in archs:
        raise _row_error(path, i, row, f"arch={row.get('arch')!r}: a cpu row names its instruction set, "
                                       f"add \"arch\": one of {archs} (e.g. \"x86\" for Intel/AMD, \"arm\" for Graviton)")
    return row


def load_prices(path: str | Path | None = None) -> list[dict[str, Any]]:
    """The rows of ``data/prices.json`` (or ``path``), each checked by ``check_row``; names must be unique."""
    return load_rows(path if path is not None else prices_path(), "prices", check_row, "name", "price table")


def price_for(kind: str, arch: str | None = None, prices: Sequence[dict[str, Any]] | None = None) -> str:
    """The price row a run on this machine is priced at by default: the first ``kind`` row ("cpu" or "gpu") of the
    table, for a CPU the first whose ``arch`` is this machine's ("x86", "arm"), so an x86 laptop is not priced as an
    Arm instance. ``ValueError`` when the table has none."""
    rows = [check_row(r, i) for i, r in enumerate(load_prices() if prices is None else prices)]
    mine = [r for r in rows if r["kind"] == kind and (kind != "cpu" or arch is None or r.get("arch") == arch)]
    if not mine:
        raise ValueError(f"data/prices.json has no {kind} row{f' for {arch}' if arch else ''}: add one, or set "
                         "HOURLY_USD to this machine's own price")
    return mine[0]["name"]


def usd_per_million_tokens(tokens_per_s: float, hourly_usd: float) -> float:
    """Dollars per million tokens for an instance producing ``tokens_per_s`` while it costs ``hourly_usd``."""
    positive_float("tokens_per_s", tokens_per_s)
    positive_float("hourly_usd", hourly_usd)
    return hourly_usd / (tokens_per_s * SECONDS_PER_HOUR) * 1e6


def _throughput(tokens_per_s: float | Mapping[str, float], row: dict[str, Any]) -> float | None:
    if isinstance(tokens_per_s, Mapping):
        return tokens_per_s.get(row["name"], tokens_per_s.get(row["kind"]))
    return tokens_per_s


def cost_table(tokens_per_s: float | Mapping[str, float], prices: Sequence[dict[str, Any]] | None = None, *,
               kind: str | None = None, hourly_usd: float | None = None, label: str = "your price",
               per_gpu: bool = True):
    """$ per million output tokens at each price (a pandas DataFrame, cheapest first).

    ``tokens_per_s``: the measured throughput, one number for every row, or a mapping by row name or kind
    (``{"cpu": 21.0, "gpu": 1800.0}``); rows it gives no throughput get None. ``per_gpu``: the throughput is
    one GPU's, so a GPU row's instance produces it ``gpus`` times over (one replica per GPU). ``hourly_usd``
    adds the learner's own price for the machine that measured the throughput, labelled ``label`` (of kind
    ``kind``, else "cpu"; one unit, never scaled). ``kind`` keeps only "gpu" or "cpu" rows.
    """
    import pandas as pd

    rows = list(load_prices() if prices is None else prices)
    for i, row in enumerate(rows):
        check_row(row, i)
    if kind is not None:
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: choose one of {KINDS} (or None for both)")
        rows = [r for r in rows if r["kind"] == kind]
    if hourly_usd is not None:
        own = {"name": label, "kind": kind or "cpu", "hourly_usd": hourly_usd, "source": "set in this notebook",
               "date": dt.date.today().isoformat(), "gpus": None}
        usd_per_million_tokens(1.0, hourly_usd)  # the same check as every row's price
        rows.insert(0, own)
    out = []
    for row in rows:
        tps = _throughput(tokens_per_s, row)
        scale = (row.get("gpus") or 1) if per_gpu and row["kind"] == "gpu" else 1
        instance_tps = tps * scale if tps is not None else None
        out.append({"name": row["name"], "kind": row["kind"], "gpus": row.get("gpus"), "hourly_usd": row["hourly_usd"],
                    "tokens_per_s": instance_tps,
                    "usd_per_million_tokens": (usd_per_million_tokens(instance_tps, row["hourly_usd"])
                                               if instance_tps is not None else None),
                    "date": row["date"], "source": row["source"]})
    table = pd.DataFrame(out)
    if not table.empty:
        table = table.sort_values("usd_per_million_tokens", na_position="last", kind="stable").reset_index(drop=True)
    return table


def cpu_as_if(per_core_tokens_per_s: float, cores: int, prices: Sequence[dict[str, Any]] | None = None,
              where: str = "at the knee") -> tuple[dict[str, float], str]:
    """Throughputs to price CPU rows with, from one single-thread replica's ``per_core_tokens_per_s`` measured here:
    this machine runs ``cores`` such replicas (one per core), and each CPU row's instance is priced as if each of its
    vCPUs did what one core here did. Returns ({row name → tokens/s, "your price" → this machine's}, the sentence
    that says so, to print beside the table). An assumption, stated as one: an instance's CPU is not this one, and
    a vCPU is often half a core (SMT). ``where``: the sweep point the throughput was read at, in words."""
    positive_float("per_core_tokens_per_s", per_core_tokens_per_s, "one replica's measured tokens/s")
    if isinstance(cores, bool) or not isinstance(cores, int) or cores <= 0:
        raise ValueError(f"cores={cores!r}: the cores this machine gives replicas, a positive integer")
    rows = [check_row(r, i) for i, r in enumerate(load_prices() if prices is None else prices)]
    machine = per_core_tokens_per_s * cores
    tps = {r["name"]: per_core_tokens_per_s * r["vcpus"] for r in rows if r["kind"] == "cpu" and r.get("vcpus")}
    tps["your price"] = machine
    said = (f"Priced as if each vCPU of an instance decoded {per_core_tokens_per_s:.1f} tokens/s, as one core here "
            f"did (one single-thread replica {where}), and as if this machine ran {cores} such replicas "
            f"({machine:.1f} tokens/s); the instances' CPUs are not this one (see each row's arch), and a cloud vCPU "
            "is often half a core.")
    return tps, said
