"""Mixture-of-experts arithmetic: the experts a config routes, a parameter count extended to all of them, and the
weights a token and a batch read.

A mixture-of-experts layer holds E routed experts and sends each token to k of them. Its parameter count is
linear in E (each expert adds the same parameters), so a model of 256 experts is counted from builds with one,
two and three (``extend``: the two steps must agree). A token reads only the k experts it is routed to: the
active parameters (``active``). A decode step of B tokens, routing spread evenly, reaches E × (1 − (1 − k/E)^B)
experts per layer (``experts_reached``): k at batch 1, all E as the batch grows; ``bytes_read`` turns that into
weight bytes.

``labkit.model.sizing`` builds the model on the meta device and counts it; this module knows no model class and
no dtype, only the counts: a dense model (``routing`` is ``None``) never reaches it.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.checks import positive

EXPERT_FIELDS = ("n_routed_experts", "num_experts", "num_local_experts")  # routed experts per MoE layer
TOPK_FIELDS = ("num_experts_per_tok", "top_k_experts", "moe_topk", "num_experts_per_token")  # experts each token is sent to
# a model's counts: (parameters, quantisable weights, their rows, and the same three for the routed experts alone)
Counts = tuple[int, ...]


@dataclass(frozen=True)
class Routing:
    """How a config routes: the field that holds its expert count, the count, and the experts each token reaches."""

    field: str
    n_experts: int
    experts_per_token: int | None  # None: the config does not say


def routing(text: dict[str, Any]) -> Routing | None:
    """The routing of a text config dict (``kvlayout.text_config``); ``None`` for a dense model."""
    field = next((f for f in EXPERT_FIELDS if text.get(f)), None)
    if field is None:
        return None
    top_k = next((int(text[f]) for f in TOPK_FIELDS if text.get(f)), None)
    return Routing(field, int(text[field]), top_k)


def with_experts(data: dict[str, Any], field: str, n: int) -> dict[str, Any]:
    """A copy of config dict ``data`` with ``n`` routed experts (in its text config where it has one)."""
    out = json.loads(json.dumps(data))
    text = out["text_config"] if isinstance(out.get("text_config"), dict) and field in out["text_config"] else out
    text[field] = n
    return out


def extend(count: Callable[[dict[str, Any]], Counts], data: dict[str, Any], r: Routing,
           name: str) -> tuple[Counts, Counts]:
    """(the model's counts, the routed part's three counts per expert), ``count`` being the model's counter. Up to
    three experts the model is counted as it is; beyond, it is counted with one, two and three experts and the
    step extended to ``r.n_experts`` (a 256-expert model takes seconds, not a minute). ``ValueError`` when the
    count is not linear in the experts."""
    if r.n_experts <= 3:
        counts = count(data)
        return counts, tuple(c // r.n_experts for c in counts[3:])
    c1, c2, c3 = (count(with_experts(data, r.field, k)) for k in (1, 2, 3))
    step = tuple(b - a for a, b in zip(c1, c2))
    if step != tuple(b - a for a, b in zip(c2, c3)):
        raise ValueError(f"{name}: the parameter count is not linear in {r.field}; cannot extend it to {r.n_experts}")
    return tuple(a + d * (r.n_experts - 1) for a, d in zip(c1, step)), step[3:]


def active(counts: Counts, per_expert: Counts, r: Routing) -> tuple[int, int, int]:
    """(parameters, quantisable weights, their rows) one token reads: the model's, less the routed experts it does
    not reach in each layer. All of them when the config does not say how many a token reaches."""
    idle = (r.n_experts - r.experts_per_token) if r.experts_per_token else 0
    n_params, quant, rows = counts[:3]
    return n_params - idle * per_expert[0], quant - idle * per_expert[1], rows - idle * per_expert[2]


def experts_reached(n_experts: int, experts_per_token: int, batch: int) -> float:
    """Experts per layer that ``batch`` tokens reach, each choosing ``experts_per_token`` of ``n_experts`` with
    routing spread evenly: E × (1 − (1 − k/E)^batch)."""
    e, k = n_experts, experts_per_token
    return e * (1 - (1 - k / e) ** positive("batch", batch))


def bytes_read(total_bytes: int, active_bytes: int, n_experts: int, experts_per_token: int, batch: int) -> int:
    """Weight bytes one decode step of ``batch`` tokens reads: what one token reads (``active_bytes``) plus one
    expert's bytes for every further expert the batch reaches (``experts_reached``); ``total_bytes`` at most."""
    e, k = n_experts, experts_per_token
    per_expert = (total_bytes - active_bytes) / (e - k)
    return int(round(total_bytes - per_expert * (e - experts_reached(e, k, batch))))
