"""Where the time goes: torch.profiler over one prefill and one decode step, ops grouped
into matmul / attention / other.

Grouping by operator name works for HF decoder models: the linear layers run as 2-D GEMMs
(``aten::mm`` / ``aten::addmm``), attention as a fused SDPA kernel or, in eager mode, as
batched products (``aten::bmm``) around a softmax. Times are *self* times, so an op that
calls another (``aten::linear`` → ``aten::mm``) is never counted twice.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..model.prompts import prompt_of_length
from . import decode
from .decode import extend, positions, prefill

GROUPS = ("matmul", "attention", "other")
_MATMUL = ("aten::mm", "aten::addmm", "aten::_addmm_activation", "aten::linear", "aten::matmul",
           "aten::_int_mm", "aten::_weight_int8pack_mm", "aten::_weight_int4pack_mm")
_ATTENTION_MARKS = ("scaled_dot_product", "flash_attention", "efficient_attention", "softmax", "aten::bmm",
                    "aten::baddbmm", "flash_attn")


def op_group(name: str) -> str:
    """'matmul', 'attention' or 'other' for one profiler op name."""
    low = name.lower()
    if any(mark in low for mark in _ATTENTION_MARKS):
        return "attention"
    if low in _MATMUL or low.startswith(("aten::mm", "aten::addmm")) or "gemm" in low or "gemv" in low:
        return "matmul"
    return "other"


@dataclass
class StepProfile:
    """Self time per operator for one step, in microseconds, from torch.profiler's key averages."""

    step: str
    device_kind: str  # "cpu": self CPU time; "cuda": GPU time of the kernels each operator launched
    ops: list[dict[str, Any]]  # name, group, calls, self_us
    share_samples: dict[str, list[float]] | None = None  # group → its share in each profiled repeat

    @property
    def total_us(self) -> float:
        return sum(o["self_us"] for o in self.ops)

    def frame(self, top: int | None = 10):
        """Top operators by self time with their share of the step."""
        import pandas as pd

        df = pd.DataFrame(self.ops).sort_values("self_us", ascending=False)
        df["share"] = df["self_us"] / self.total_us
        df.insert(0, "step", self.step)
        return (df.head(top) if top else df).reset_index(drop=True)

    def groups(self):
        """Self time and share per group (matmul / attention / other)."""
        import pandas as pd

        df = pd.DataFrame(self.ops).groupby("group", as_index=False)["self_us"].sum()
        df = df.set_index("group").reindex(list(GROUPS), fill_value=0.0).reset_index()
        df["share"] = df["self_us"] / self.total_us
        df.insert(0, "step", self.step)
        return df


def _from_profiler(prof: Any, step: str, cuda: bool) -> StepProfile:
    from torch.autograd import DeviceType

    ops = []
    for ev in prof.key_averages():
        if cuda:
            # operator rows carry the GPU time of the kernels they launched; kernel rows would count it twice
            if ev.device_type != DeviceType.CPU:
                continue
            self_us = float(ev.self_device_time_total)
        else:
            self_us = float(ev.self_cpu_time_total)
        if self_us <= 0:
            continue
        ops.append({"name": ev.key, "group": op_group(ev.key), "calls": int(ev.count), "self_us": self_us})
    assert ops, "the profiler recorded no operators: was anything run inside the profile block?"
    return StepProfile(step=step, device_kind="cuda" if cuda else "cpu", ops=ops)


def profile_prefill_decode(model: Any, tokenizer: Any, prompt_tokens: int = 64, warmup: int = 1,
                           repeats: int = 1) -> list[StepProfile]:
    """Profile one prefill of ``prompt_tokens`` tokens and the decode step that follows it.

    ``warmup`` untimed prefill+decode pairs run first so the profile shows steady work, not lazy set-up. The
    decode step is profiled ``repeats`` times (each after a fresh prefill): the decode profile returned is the
    one of median total time, and its ``share_samples`` hold every repeat's share per group, so a takeaway
    can tell a real split from one noisy step.
    """
    import torch
    from torch.profiler import ProfilerActivity, profile

    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup={warmup!r}: must be 0 or a positive integer")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: must be a positive integer")
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    inputs = prompt_of_length(tokenizer, prompt_tokens, device=str(device))

    mask = extend(inputs["attention_mask"])  # the decode step's mask: the prompt plus its first token
    pos = positions(mask)[:, -1]
    decodes = []
    with torch.inference_mode():
        for _ in range(warmup):
            logits, cache = prefill(model, inputs["input_ids"], inputs["attention_mask"])
            decode.decode_one_token(model, logits.argmax(-1), cache, pos, mask)
        with profile(activities=activities) as prof_prefill:
            logits, cache = prefill(model, inputs["input_ids"], inputs["attention_mask"])
        for i in range(repeats):
            if i:
                logits, cache = prefill(model, inputs["input_ids"], inputs["attention_mask"])
            token = logits.argmax(-1)  # (batch,): greedy next token
            with profile(activities=activities) as prof_decode:
                decode.decode_one_token(model, token, cache, pos, mask)
            decodes.append(_from_profiler(prof_decode, "decode (1 token)", cuda))
    step = sorted(decodes, key=lambda p: p.total_us)[(len(decodes) - 1) // 2]
    step.share_samples = {g: [float(p.groups().set_index("group").share[g]) for p in decodes] for g in GROUPS}
    return [_from_profiler(prof_prefill, f"prefill ({prompt_tokens} tokens)", cuda), step]


def top_ops_frame(profiles: list[StepProfile], top: int = 8):
    import pandas as pd

    return pd.concat([p.frame(top) for p in profiles], ignore_index=True)


def groups_frame(profiles: list[StepProfile]):
    import pandas as pd

    return pd.concat([p.groups() for p in profiles], ignore_index=True)


def groups_figure(profiles: list[StepProfile]):
    """Stacked bars: share of each step's self time spent in matmul / attention / other."""
    import plotly.express as px

    df = groups_frame(profiles)
    df["percent"] = 100 * df["share"]
    fig = px.bar(df, x="step", y="percent", color="group", text_auto=".1f",
                 category_orders={"group": list(GROUPS)},
                 title="Where one step's time goes (profiler self time)")
    fig.update_layout(yaxis_title="% of the step's self time", barmode="stack", template="plotly_white")
    return fig
