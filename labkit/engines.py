"""Compiled engines: the same model run eagerly, compiled by torch.compile, optimised by ONNX Runtime's graph
optimiser, and (on an NVIDIA GPU, where installed) built by TensorRT or served by vLLM.

An inference compiler does three things to a model: it *fuses* chains of small operators into one
kernel (one read and one write of memory instead of one per operator), it *rewrites the graph*
(constant folding, removing no-op reshapes, recognising attention or layer-norm patterns and calling a
fused implementation), and it *chooses precision* per layer (TensorRT calibrates int8 scales on sample
data). Each row this module measures carries what the build cost (``build_s``), TTFT, decode tokens/s
and quality against the fp32 eager reference (``labkit.quality``: greedy agreement and KL).

torch paths use a static KV cache (every position allocated once, written in place), so the decode step
has the same shapes at every token: compiled once, reused for every token after. ``labkit.decode.prefill``
runs the prompt eagerly; ``static_step`` (``labkit.decode.decode_one_token`` on the static cache) is what
gets compiled.
"""
from __future__ import annotations

import collections
import contextlib
import functools
import gc
import importlib.metadata
import importlib.util
import io
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import decode, env
from .env import Capability
from .generation import GenerationResult
from .timing import Measurement, clock, now, track

ORT_LEVELS: tuple[str, ...] = ("disable_all", "basic", "extended", "all")
DEFAULT_PROMPT = "Write a short story about a lighthouse keeper."
DEFAULT_MAX_CACHE_LEN = 256  # static cache positions: prompt + generated tokens must fit
REFERENCE = "08_tensorrt"  # data/reference/08_tensorrt.json (CPU, full mode): compile rows for quick mode


# ---------------------------------------------------------------------------------------- capabilities


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "installed"


def _cuda_reason() -> str:
    import torch

    return "" if torch.cuda.is_available() else "needs an NVIDIA GPU with CUDA; this machine has none"


def capabilities() -> list[Capability]:
    """Each engine this module knows, available here or not, and why not."""
    from . import env

    rows = [env.capability("torch.compile"), env.capability("onnxruntime")]
    gpu = _cuda_reason()
    for name, module, install in (
            ("torch-tensorrt", "torch_tensorrt", "pip install torch-tensorrt (matching your torch)"),
            ("tensorrt-llm", "tensorrt_llm", "pip install tensorrt-llm (its own environment, see README)"),
            ("vllm", "vllm", "pip install vllm (its own environment, see README)")):
        if gpu:
            rows.append(Capability(name, False, "", gpu))
        elif not _has(module):
            rows.append(Capability(name, False, "", f"not installed: {install}"))
        else:
            rows.append(Capability(name, True, _version(name), ""))
    rows.append(_ort_tensorrt())
    return rows


def _ort_tensorrt() -> Capability:
    """ONNX Runtime's TensorRT provider, counted available only when a session on it really gets it.

    onnxruntime-gpu lists TensorrtExecutionProvider whether or not TensorRT's libraries are installed;
    a session then falls back to CUDA or the CPU. So the check builds a one-node session and asks it.
    """
    name = "ort-tensorrt"
    if not _has("onnxruntime"):
        return Capability(name, False, "", "onnxruntime is not installed")
    import onnxruntime as ort

    gpu = _cuda_reason()
    if gpu:
        return Capability(name, False, "", gpu)
    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        return Capability(name, False, "", "this onnxruntime has no TensorrtExecutionProvider: "
                                           "pip install onnxruntime-gpu (the [gpu] extra) and TensorRT")
    problem = tensorrt_provider_problem()
    if problem:
        return Capability(name, False, "", problem)
    return Capability(name, True, f"onnxruntime {ort.__version__}", "")


@functools.lru_cache(maxsize=1)
def tensorrt_provider_problem() -> str:
    """'' when an ONNX Runtime session on TensorrtExecutionProvider really gets it; otherwise why not.
    Cached: TensorRT's libraries load (or not) once per process."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    preload_tensorrt()
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.log_severity_level = 4  # the probe's failure is reported below, not logged
    quiet = io.StringIO()  # onnxruntime prints its own fallback notice
    try:
        with contextlib.redirect_stdout(quiet), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not in available provider names": the answer is read below
            sess = ort.InferenceSession(model.SerializeToString(), so, providers=["TensorrtExecutionProvider"])
    except (RuntimeError, ValueError, OSError) as exc:
        return f"TensorRT's libraries did not load: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
    got = sess.get_providers()
    if got[:1] != ["TensorrtExecutionProvider"]:
        return (f"onnxruntime lists TensorrtExecutionProvider but a session got {got}: TensorRT's libraries "
                f"({_tensorrt_sonames()}) did not load; install the TensorRT version this onnxruntime was built for")
    return ""


def preload_tensorrt() -> None:
    """Import TensorRT's Python package where installed: it loads TensorRT's libraries from its wheel, which
    are not on the loader's path, so ONNX Runtime's TensorRT provider then finds them (when the versions match)."""
    with contextlib.suppress(ImportError, OSError):
        import tensorrt  # noqa: F401


def _tensorrt_sonames() -> str:
    """The TensorRT libraries this onnxruntime's TensorRT provider links against (read from its ELF header)."""
    import onnxruntime as ort

    lib = Path(ort.__file__).parent / "capi" / "libonnxruntime_providers_tensorrt.so"
    try:
        data = lib.read_bytes()
    except OSError:
        return "libnvinfer"
    found = sorted({m.decode() for m in re.findall(rb"libnv(?:infer|onnxparser)[a-z_]*\.so\.[0-9]+", data)})
    return ", ".join(found) or "libnvinfer"


def capability(name: str) -> Capability:
    table = {c.name: c for c in capabilities()}
    if name not in table:
        raise ValueError(f"unknown engine capability {name!r}; choose one of {sorted(table)}")
    return table[name]


def capabilities_frame():
    import pandas as pd

    return pd.DataFrame([c.__dict__ for c in capabilities()])


# ------------------------------------------------------------------ torch: static cache, prefill, decode


def _device(model: Any) -> Any:
    return next(model.parameters()).device


def static_step(model: Any, token: Any, position: Any, cache: Any) -> Any:
    """``labkit.decode.decode_one_token`` on a static cache: (1,) token at (1,) position in, (1, V) logits out,
    the cache written in place at that position. Every call has the same shapes, so a compiled version is
    built once and reused."""
    return decode.decode_one_token(model, token, cache, position_ids=position, cache_position=position)


class StaticDecoder:
    """Greedy decoding with a static KV cache, eager or with ``static_step`` compiled.

    ``compile=True`` wraps the decode step in ``torch.compile(dynamic=False)`` with ``backend`` (inductor,
    or 'tensorrt' from torch-tensorrt on a GPU). The first decode call traces and builds it; ``build_s``
    is that call's duration, measured against an empty inductor cache when ``fresh_cache`` (as on a new
    machine) and ``kernels`` what inductor generated.
    """

    def __init__(self, model: Any, max_cache_len: int = DEFAULT_MAX_CACHE_LEN, compile: bool = False,
                 backend: str = "inductor", mode: str | None = None, fresh_cache: bool = True) -> None:
        import torch
        from transformers import StaticCache

        if isinstance(max_cache_len, bool) or not isinstance(max_cache_len, int) or max_cache_len <= 1:
            raise ValueError(f"max_cache_len={max_cache_len!r}: must be an integer above 1")
        self.model = model
        self.max_cache_len = max_cache_len
        self.cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
        self.compiled = compile
        self.fresh_cache = fresh_cache
        self.build_s: float | None = None
        self.kernels: dict[str, int] = {}
        self._step = torch.compile(static_step, backend=backend, mode=mode, dynamic=False) if compile \
            else static_step

    def _first_compiled_step(self, *args: Any) -> Any:
        from torch._inductor import metrics

        from .warmup import fresh_compile_cache

        metrics.reset()
        with fresh_compile_cache() if self.fresh_cache else contextlib.nullcontext():
            t0 = now(_device(self.model))
            logits = self._step(*args)
            self.build_s = now(_device(self.model)) - t0
        self.kernels = {"ir_nodes_before_fusion": metrics.ir_nodes_pre_fusion,
                        "generated_kernels": metrics.generated_kernel_count}
        return logits

    def generate(self, input_ids: Any, new_tokens: int, feed: Any = None, keep_logits: bool = False
                 ) -> tuple[GenerationResult, list[int], list[Any]]:
        """Greedy tokens after the (1, T) prompt, each stamped as it arrives.

        ``feed``: (new_tokens - 1,) tokens to feed instead of the model's own choices (teacher forcing,
        for quality). Returns the timing, the chosen tokens and, with ``keep_logits``, each step's logits.
        """
        import torch

        if isinstance(new_tokens, bool) or not isinstance(new_tokens, int) or new_tokens <= 0:
            raise ValueError(f"new_tokens={new_tokens!r}: must be a positive integer")
        n_prompt = input_ids.shape[1]
        if n_prompt + new_tokens > self.max_cache_len:
            raise ValueError(f"prompt {n_prompt} + {new_tokens} new tokens exceed max_cache_len={self.max_cache_len}; "
                             "build the decoder with a larger max_cache_len")
        device = input_ids.device
        kept: list[Any] = []
        tokens: list[int] = []
        stamps: list[float] = []
        with torch.inference_mode():
            self.cache.reset()  # its tensors were made in inference mode: zero them there
            start = now(device)
            logits, _ = decode.prefill(self.model, input_ids, cache=self.cache)
            for i in range(new_tokens):
                if i > 0:
                    token = (feed[i - 1] if feed is not None else next_token).view(1)
                    position = torch.tensor([n_prompt + i - 1], device=device)
                    if self.compiled and self.build_s is None:
                        logits = self._first_compiled_step(self.model, token, position, self.cache)
                    else:
                        logits = self._step(self.model, token, position, self.cache)
                next_token = logits.argmax(-1)
                tokens.append(int(next_token))  # the host sync: this token is ready
                stamps.append(now(device))
                if keep_logits:
                    kept.append(logits[0].detach().to("cpu", torch.float32).clone())
        return GenerationResult.from_stamps(start, stamps, n_prompt), tokens, kept


def measure_decoder(dec: StaticDecoder, input_ids: Any, new_tokens: int = 32, repeats: int = 3) -> dict[str, Any]:
    """TTFT and steady decode rate of ``dec`` (one untimed warmup run first; it pays any compilation)."""
    if repeats <= 0:
        raise ValueError(f"repeats={repeats}: must be at least 1")
    if new_tokens < 2:
        raise ValueError(f"new_tokens={new_tokens}: need at least 2 to time decode")
    dec.generate(input_ids, min(4, new_tokens))  # warmup (and the compile, when compiled)
    runs = [dec.generate(input_ids, new_tokens) for _ in range(repeats)]
    tpot = Measurement.from_values("tpot", [r.tpot_s for r, _, _ in runs if r.tpot_s is not None])
    return {"ttft_s": min(r.ttft_s for r, _, _ in runs), "tpot_s": tpot.median, "tpot_spread": tpot.spread,
            "decode_tokens_per_s": 1 / tpot.median, "new_tokens": new_tokens, "repeats": repeats,
            "build_s": dec.build_s, **dec.kernels, "tokens": runs[0][1]}


def decoder_quality(dec: StaticDecoder, ref: Any) -> Any:
    """Teacher-force the reference's greedy continuations through ``dec``'s own decode path: the share of
    positions where its argmax is the reference's token, and KL(reference ‖ dec) per token (nats)."""
    import torch

    from . import quality

    agree = n = 0
    kl_sum, kl_max = 0.0, 0.0
    rows = []
    device = _device(dec.model)
    for text, seq, n_prompt, ref_lp in zip(ref.prompts, ref.sequences, ref.n_prompt, ref.logprobs):
        cont = seq[0, n_prompt:].to(device)
        _, _, logits = dec.generate(seq[:, :n_prompt].to(device), len(cont), feed=cont[:-1], keep_logits=True)
        logits = torch.stack(logits)
        same = int((logits.argmax(-1) == cont.cpu()).sum())
        kl = quality.kl_divergence(ref_lp, logits)
        rows.append({"prompt": text, "agreement": same / len(cont), "kl": float(kl.mean()), "n_tokens": len(cont)})
        agree, n = agree + same, n + len(cont)
        kl_sum, kl_max = kl_sum + float(kl.sum()), max(kl_max, float(kl.max()))
    return quality.Agreement(agreement=agree / n, kl=kl_sum / n, kl_max=kl_max, n_tokens=n, per_prompt=rows)


def count_eager_ops(model: Any, input_ids: Any, max_cache_len: int = DEFAULT_MAX_CACHE_LEN) -> int:
    """How many PyTorch (aten) operators one eager decode step calls: each is a kernel launch and a
    round trip of its inputs and outputs through memory."""
    import torch

    dec = StaticDecoder(model, max_cache_len=max_cache_len)
    with torch.inference_mode():
        logits, _ = decode.prefill(model, input_ids, cache=dec.cache)
        position = torch.tensor([input_ids.shape[1]], device=input_ids.device)
        return len(eager_ops(static_step, model, logits.argmax(-1).view(1), position, dec.cache))


# ------------------------------------------------------------ fusion: one elementwise chain, eager and compiled


def rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> Any:
    """RMSNorm as a Llama's eager forward runs it, one kernel per operator (pow, mean, add, rsqrt, mul, mul):
    (..., hidden) activations and a (hidden,) weight → (..., hidden)."""
    import torch

    variance = x.pow(2).mean(-1, keepdim=True)  # (..., 1): each row's mean square
    return x * torch.rsqrt(variance + eps) * weight


def rms_norm_traffic(rows: int, hidden: int, bytes_per_value: int) -> tuple[int, int]:
    """Bytes of (rows, hidden)-sized tensors that RMSNorm moves through memory: (eager, fused).

    Eager, one kernel per operator: ``x.pow(2)`` reads x and writes x² (2 trips), ``mean`` reads x² (1),
    ``x * r`` reads x and writes y (2), ``y * weight`` reads y and writes the output (2): 7 trips. Fused
    into one kernel: x is read once and the output written once: 2. The (rows, 1) statistics and the
    (hidden,) weight are small next to these and left out.
    """
    for name, value in (("rows", rows), ("hidden", hidden), ("bytes_per_value", bytes_per_value)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name}={value!r}: must be a positive integer")
    full = rows * hidden * bytes_per_value
    return 7 * full, 2 * full


def _op_counter() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        """Records every aten operator dispatched inside the block (each one kernel launch when eager)."""

        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.ops.append(str(func.overloadpacket.__name__))
            return func(*args, **(kwargs or {}))

    return OpCounter()


def eager_ops(fn: Any, *args: Any) -> list[str]:
    """The aten operators ``fn(*args)`` runs eagerly, in order: one kernel launch each."""
    import torch

    counter = _op_counter()
    with torch.inference_mode(), counter:
        fn(*args)
    return counter.ops


def explain(fn: Any, *args: Any) -> dict[str, Any]:
    """What torch.compile's front end (dynamo) captures of ``fn(*args)``: how many graphs, how many graph
    breaks (and why, first line of each reason), and how many operators the graphs hold. It traces only:
    nothing is compiled. Every break ends one graph and starts another, and nothing fuses across it."""
    import logging

    import torch

    quiet = logging.getLogger("torch._dynamo")  # each break is also logged as a warning: the reasons are returned
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        out = torch._dynamo.explain(fn)(*args)
    finally:
        quiet.setLevel(level)
    ops = sum(1 for g in out.graphs for n in g.graph.nodes if n.op in ("call_function", "call_method"))
    return {"graphs": out.graph_count, "graph_breaks": out.graph_break_count, "graph_ops": ops,
            "break_reasons": [r.reason.strip().splitlines()[0] for r in out.break_reasons]}


@dataclass
class Fused:
    """``torch.compile`` of one function for one input shape, and what its first call did."""

    fn: Any  # the compiled callable (same arguments as the original)
    first_call_s: float  # the first call: trace, fuse, generate code, build it (or load the build from disk)
    kernels: list[str]  # the kernels inductor generated, named after the operators fused into each
    code: str  # the module inductor wrote (its kernels' source included)
    cache_entries_before: int  # entries in inductor's on-disk cache folder before the call: 0 means a cold build


def _inductor_cache_entries() -> int:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    root = Path(cache_dir())
    return sum(1 for _ in root.iterdir()) if root.is_dir() else 0


def compile_fused(fn: Any, *args: Any, backend: str = "inductor") -> Fused:
    """``torch.compile(fn, dynamic=False)`` and its first call on ``args``, timed on their device.

    Inductor's FX-graph cache is off for the call, so the kernels are really generated (and counted from the
    code it writes); building them may still reuse inductor's on-disk cache of earlier runs (the C++ or
    Triton build of identical source), which ``cache_entries_before`` reports.
    """
    import re
    from unittest import mock

    import torch
    from torch._inductor.graph import GraphLowering

    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    compiled = torch.compile(fn, backend=backend, dynamic=False)
    code: list[str] = []
    before = _inductor_cache_entries()
    with mock.patch.object(GraphLowering, "save_output_code", code.append), \
            torch._inductor.config.patch(fx_graph_cache=False), torch.inference_mode():
        t0 = now(device)
        compiled(*args)
        first = now(device) - t0
    text = "\n\n".join(code)
    kernels = re.findall(r"^(\w+) = async_compile\.\w+\(", text, flags=re.M)
    return Fused(fn=compiled, first_call_s=first, kernels=kernels, code=text, cache_entries_before=before)


def time_per_call(fn: Any, *args: Any, repeats: int = 5, min_sample_s: float = 0.01) -> Measurement:
    """Seconds per call of ``fn(*args)`` (after one untimed call). Each sample averages enough calls to
    last ``min_sample_s``, so a call of a few microseconds is not lost in the clock's resolution."""
    import torch

    if repeats <= 0:
        raise ValueError(f"repeats={repeats}: must be at least 1")
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
    with torch.inference_mode():
        fn(*args)
        t0 = now(device)
        fn(*args)
        once = max(now(device) - t0, 1e-7)
        inner = max(1, int(min_sample_s / once))
        samples = []
        for _ in range(repeats):
            t0 = now(device)
            for _ in range(inner):
                fn(*args)
            samples.append((now(device) - t0) / inner)
    return Measurement.from_values("per call", samples, warmup=2, meta={"calls_per_sample": inner})


def fusion_rows(fn: Any, fused: dict[str, Fused], inputs: dict[str, tuple[Any, ...]], repeats: int = 5
                ) -> list[dict[str, Any]]:
    """One row per input shape: ``fn`` eager against its compiled version (``fused[label]``), with the
    operators eager runs, the kernels compiled runs, both times, and the largest difference between their
    outputs (fusion reorders arithmetic: a few ulps, never a different answer)."""
    import torch

    rows = []
    for label, args in inputs.items():
        with torch.inference_mode():
            diff = float((fused[label].fn(*args) - fn(*args)).abs().max())
        eager_t = time_per_call(fn, *args, repeats=repeats)
        fused_t = time_per_call(fused[label].fn, *args, repeats=repeats)
        rows.append({"input": label, "shape": tuple(args[0].shape), "eager_ops": len(eager_ops(fn, *args)),
                     "fused_kernels": len(fused[label].kernels), "eager_us": eager_t.median * 1e6,
                     "compiled_us": fused_t.median * 1e6, "speedup": eager_t.median / fused_t.median,
                     "max_abs_diff": diff, "first_call_s": fused[label].first_call_s})
    return rows



# --------------------------------------------------------------------- ONNX Runtime graph optimisation


def ort_level(level: str) -> Any:
    """onnxruntime.GraphOptimizationLevel for 'disable_all', 'basic', 'extended' or 'all'."""
    import onnxruntime as ort

    table = {"disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
             "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
             "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
             "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
    if level not in table:
        raise ValueError(f"unknown ONNX Runtime optimisation level {level!r}; choose one of {list(ORT_LEVELS)}")
    return table[level]


def session_options(level: str, optimized_path: str | Path | None = None) -> Any:
    """SessionOptions at ``level``; with ``optimized_path``, ONNX Runtime also writes the graph it optimised
    there (weights to a side file), so its operators can be counted."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort_level(level)
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
        so.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                    Path(optimized_path).stem + ".data")
        so.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    return so


def load_ort(level: str, model_name: str | None = None, provider: str | None = None,
             count_ops: bool = False) -> dict[str, Any]:
    """The exported model (``labkit.variants.export_onnx``, cached) in an ONNX Runtime session at ``level``.

    Returns the model, ``build_s`` (session creation: loading plus graph optimisation), ``providers`` (what
    the session really got) and, with ``count_ops``, the optimised graph's operator counts. Those come from
    a second session that writes the graph it optimised to a temporary folder, so writing it never counts
    as build time. A session that did not get ``provider`` raises ``variants.ProviderFallback`` with the
    reason: its numbers would be another provider's. The TensorRT provider gets an engine cache and shape
    profiles (``tensorrt_provider_options``), with CUDA under it for what TensorRT does not take.
    """
    from optimum.onnxruntime import ORTModelForCausalLM

    from . import env, models, variants

    ort_level(level)
    folder, export_s = variants.export_onnx(model_name)
    provider = variants.ort_provider(env.device(), provider)
    providers, options = [provider], None
    if provider == "TensorrtExecutionProvider":
        preload_tensorrt()
        providers = ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
        options = [tensorrt_provider_options(folder / "model.onnx"), {}]
    with track(env.device()) as t:  # session creation: loading plus graph optimisation (and engine builds)
        model = ORTModelForCausalLM.from_pretrained(folder, providers=providers, provider_options=options,
                                                    session_options=session_options(level), use_cache=True)
    build_s = t.seconds
    got = variants.session_providers(model)
    problem = variants.check_providers(provider, got)
    if problem:
        raise variants.ProviderFallback(problem)
    ops = optimized_ops(folder / "model.onnx", level, provider) if count_ops else None
    tok = models.load_tokenizer(model_name)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return {"model": model, "tokenizer": tok, "build_s": build_s, "export_s": export_s, "provider": provider,
            "providers": got, "ops": ops, "level": level}


def optimized_ops(onnx_path: str | Path, level: str, provider: str = "CPUExecutionProvider") -> dict[str, int]:
    """Operator counts of the graph ONNX Runtime builds from ``onnx_path`` at ``level`` on ``provider``
    (``variants.ProviderFallback`` when the session did not get it: the counts would be another provider's)."""
    import onnxruntime as ort

    from . import variants

    tmp = Path(tempfile.mkdtemp(prefix="labkit-ort-"))
    try:
        so = session_options(level, tmp / f"{level}.onnx")
        so.log_severity_level = 3  # 'all' warns that its saved graph is tuned to this CPU: known, and only counted
        sess = ort.InferenceSession(str(onnx_path), so, providers=[provider])
        problem = variants.check_providers(provider, sess.get_providers())
        if problem:
            raise variants.ProviderFallback(problem)
        return graph_ops(tmp / f"{level}.onnx")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _profile_dims(dims: Sequence[int | str], max_batch: int, max_len: int) -> tuple[list[int], list[int], list[int]]:
    """(min, opt, max) of one input's dimensions: fixed sizes as they are; a dynamic batch 1…max_batch; a
    past length 0…max_len − 1 (the first step has no past); a sequence or total length 1…max_len."""
    ranges = []
    for d in dims:
        name = str(d).lower()
        if isinstance(d, int) and d > 0:
            ranges.append((d, d, d))
        elif "batch" in name:
            ranges.append((1, 1, max_batch))
        elif "past" in name and "+" not in name:
            ranges.append((0, max_len // 2, max_len - 1))
        elif "sequence" in name or "length" in name or "+" in name:
            ranges.append((1, 1, max_len))
        else:
            raise ValueError(f"dynamic dimension {d!r}: not a batch, sequence or past length; "
                             "give TensorRT its profile by hand (trt_profile_*_shapes)")
    lo, opt, hi = ([r[i] for r in ranges] for i in range(3))
    return lo, opt, hi


def tensorrt_shape_profiles(onnx_path: str | Path, max_batch: int = 1, max_len: int = DEFAULT_MAX_CACHE_LEN
                            ) -> dict[str, str]:
    """TensorRT optimisation profiles (``trt_profile_min/opt/max_shapes``) for every input of an exported
    decoder: one engine serves every prompt and cache length up to ``max_len`` instead of being rebuilt
    for each new shape. Decode (one new token) is the ``opt`` shape."""
    import onnx

    if max_batch < 1 or max_len < 2:
        raise ValueError(f"max_batch={max_batch}, max_len={max_len}: need max_batch ≥ 1 and max_len ≥ 2")
    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    shapes: dict[str, list[str]] = {"min": [], "opt": [], "max": []}
    for inp in graph.input:
        if inp.name in initializers:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in inp.type.tensor_type.shape.dim]
        for key, values in zip(("min", "opt", "max"), _profile_dims(dims, max_batch, max_len)):
            shapes[key].append(f"{inp.name}:{'x'.join(str(v) for v in values)}")
    return {f"trt_profile_{k}_shapes": ",".join(v) for k, v in shapes.items()}


def tensorrt_provider_options(onnx_path: str | Path, max_batch: int = 1, max_len: int = DEFAULT_MAX_CACHE_LEN,
                              fp16: bool = True, cache_dir: str | Path | None = None) -> dict[str, str]:
    """Provider options for ONNX Runtime's TensorRT provider: an engine and timing cache on disk (the next
    session loads the engine instead of building it), shape profiles covering every length up to
    ``max_len``, and fp16 kernels where TensorRT finds them faster (``fp16``)."""
    from . import config

    cache = Path(cache_dir) if cache_dir is not None else config.cache_dir() / "tensorrt" / Path(onnx_path).parent.parent.name
    cache.mkdir(parents=True, exist_ok=True)
    return {"trt_engine_cache_enable": "True", "trt_engine_cache_path": str(cache),
            "trt_timing_cache_enable": "True", "trt_timing_cache_path": str(cache),
            "trt_fp16_enable": "True" if fp16 else "False",
            **tensorrt_shape_profiles(onnx_path, max_batch, max_len)}


def graph_ops(path: str | Path) -> dict[str, int]:
    """Operator counts of an ONNX graph (without loading its weights), most frequent first."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return dict(collections.Counter(n.op_type for n in graph.node).most_common())


def fused_ops(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """Operators that appear (or grow) after optimisation: the fused ones, with their counts."""
    return {op: n - before.get(op, 0) for op, n in after.items() if n > before.get(op, 0)}


# ----------------------------------------------------------------------------- precision calibration


@dataclass
class Calibration:
    """One layer's int8 input scale chosen four ways, and what each does to the layer's output and to the
    model's next-token distributions, per held-out prompt."""

    layer: str
    calibration_values: int
    absmax: float  # largest |x| seen while calibrating
    percentile: float
    percentile_value: float  # |x| at that percentile of the calibration values
    scores: list[dict[str, Any]] = field(default_factory=list)  # one row per (scale choice, held-out prompt)

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.scores)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per scale choice: mean layer-output error and mean KL over the held-out prompts, worst KL too."""
        out: dict[str, dict[str, float]] = {}
        for method in dict.fromkeys(r["method"] for r in self.scores):
            rows = [r for r in self.scores if r["method"] == method]
            out[method] = {"layer_error": sum(r["layer_error"] for r in rows) / len(rows),
                           "kl": sum(r["kl"] for r in rows) / len(rows), "kl_max": max(r["kl"] for r in rows),
                           "prompts": len(rows)}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "scores"}


def fake_int8(x: Any, scale: float | Any) -> Any:
    """Quantise to symmetric int8 with ``scale`` and back: round(x / scale) clamped to ±127, times scale.
    Values beyond 127 × scale are clipped; the rest land on a grid of step ``scale``. A zero scale (an
    all-zero row) is raised to the smallest positive float, so zeros stay zeros instead of becoming NaN."""
    import torch

    tiny = torch.finfo(torch.float32).tiny
    scale = scale.clamp_min(tiny) if isinstance(scale, torch.Tensor) else max(float(scale), tiny)
    return (x / scale).round().clamp(-127, 127) * scale


def calibrate_layer(model: Any, tokenizer: Any, calibration: Sequence[str], held_out: Sequence[str],
                    layer: str = "model.layers.0.mlp.down_proj", percentile: float = 99.99) -> Calibration:
    """Precision calibration, as a static int8 engine (TensorRT's) needs it, on one layer's input activations,
    scored by what the model outputs.

    Static int8 fixes one scale per tensor *before* serving, from sample (calibration) data: the largest
    value seen ('absmax') keeps every outlier; a percentile clips the rarest ones to give the bulk finer
    steps. Dynamic int8 (ONNX Runtime's, notebook 03) takes the scale from each input at run time: here
    each held-out prompt's own activations. Each choice is scored per held-out prompt by running the model
    with only this layer's input quantised: the layer's output error ‖y_int8 − y‖ / ‖y‖, and the KL from the
    fp32 next-token distributions to the quantised ones (nats, mean over the prompt's positions). A per-token
    scale (one per row, also measured at run time) is scored too; its ``scale`` is the mean over the tokens.
    """
    import torch

    from . import quality
    from .models import chat_inputs

    if not calibration or not held_out:
        raise ValueError("pass at least one calibration prompt and one held-out prompt")
    if not 0 < percentile < 100:
        raise ValueError(f"percentile={percentile}: must lie strictly between 0 and 100")
    modules = dict(model.named_modules())
    if layer not in modules:
        linear = [n for n, m in modules.items() if isinstance(m, torch.nn.Linear)][:3]
        raise ValueError(f"no layer {layer!r} in the model; for example {linear}")
    target = modules[layer]
    device = _device(model)
    seen: dict[str, Any] = {}
    scale_now: dict[str, Any] = {}

    def quantise_input(module: Any, args: tuple) -> tuple | None:
        seen["x"] = args[0].detach()
        if "scale" not in scale_now:
            return None
        return (fake_int8(args[0], scale_now["scale"](args[0].detach())), *args[1:])

    def keep_output(module: Any, args: tuple, out: Any) -> None:
        seen["y"] = out.detach().float()

    def run(prompt: str) -> Any:
        with torch.inference_mode():
            return model(**chat_inputs(tokenizer, prompt, device=device)).logits[0].float()

    hooks = [target.register_forward_pre_hook(quantise_input), target.register_forward_hook(keep_output)]
    try:
        calib = []
        for p in calibration:
            run(p)
            calib.append(seen["x"].float().flatten().cpu())
        calib_values = torch.cat(calib).abs()
        absmax = float(calib_values.max())
        k = max(1, int(round(calib_values.numel() * percentile / 100)))
        pct = float(calib_values.kthvalue(k).values)
        choices = {"static, absmax scale": lambda x: absmax / 127,  # fixed before serving
                   f"static, p{percentile:g} scale": lambda x: pct / 127,
                   "dynamic, per-prompt scale": lambda x: x.abs().max() / 127,  # measured on each input
                   "dynamic, per-token scale": lambda x: x.abs().amax(-1, keepdim=True) / 127}
        scores = []
        for p in held_out:
            scale_now.clear()
            ref_logprobs = torch.log_softmax(run(p), dim=-1)  # fp32: nothing quantised
            x, y_ref = seen["x"].float(), seen["y"]
            for method, scale in choices.items():
                scale_now["scale"] = scale
                logits = run(p)  # the same prompt, with this layer's input quantised by ``scale``
                used = torch.as_tensor(scale(x), dtype=torch.float32, device=x.device)
                scores.append({"method": method, "prompt": p, "scale": float(used.mean()),
                               "max_at_token": int(x.abs().amax(-1).flatten().argmax()),  # where |x| peaks
                               "clipped_fraction": float((x.abs() > 127 * used).float().mean()),
                               "layer_error": float((seen["y"] - y_ref).norm() / y_ref.norm()),
                               "kl": float(quality.kl_divergence(ref_logprobs, logits).mean())})
    finally:
        for h in hooks:
            h.remove()
    return Calibration(layer=layer, calibration_values=calib_values.numel(), absmax=absmax, percentile=percentile,
                       percentile_value=pct, scores=scores)


# -------------------------------------------------------------------------------- GPU engines: TensorRT


def torch_tensorrt_options(dtype: Any, min_block_size: int = 1) -> dict[str, Any]:
    """Options for torch-tensorrt's ``torch.compile`` backend that the installed version accepts: the
    precision TensorRT may use (``enabled_precisions``, where this version still has it: newer ones
    are strongly typed and follow the model's dtype) and ``min_block_size`` (the fewest operators a
    TensorRT engine may hold: the default 5 leaves short runs of operators in PyTorch)."""
    import dataclasses

    from torch_tensorrt.dynamo import CompilationSettings

    if isinstance(min_block_size, bool) or not isinstance(min_block_size, int) or min_block_size < 1:
        raise ValueError(f"min_block_size={min_block_size!r}: must be a positive integer")
    fields = {f.name for f in dataclasses.fields(CompilationSettings)}
    wanted = {"enabled_precisions": {dtype}, "min_block_size": min_block_size, "pass_through_build_failures": False}
    return {k: v for k, v in wanted.items() if k in fields}


def partition_stats(module: Any) -> dict[str, int]:
    """How a graph torch-tensorrt returned is split: TensorRT engines (``_run_on_acc*`` submodules) and what
    stayed in PyTorch (``_run_on_gpu*`` submodules and operators outside any submodule). A graph with no
    engine ran entirely in PyTorch (TensorRT took nothing, or its build failed and it fell back)."""
    children = dict(module.named_children()) if hasattr(module, "named_children") else {}
    engines = [n for n in children if n.startswith("_run_on_acc")]
    torch_ops = 0
    graph = getattr(module, "graph", None)
    for node in (graph.nodes if graph is not None else ()):
        if node.op == "call_function":
            torch_ops += 1
        elif node.op == "call_module" and not str(node.target).startswith("_run_on_acc"):
            sub = children.get(str(node.target))
            sub_graph = getattr(sub, "graph", None)
            torch_ops += sum(n.op == "call_function" for n in sub_graph.nodes) if sub_graph is not None else 1
    return {"trt_engines": len(engines), "torch_ops": torch_ops}


def tensorrt_backend(options: dict[str, Any], stats: list[dict[str, int]]) -> Any:
    """torch-tensorrt's ``torch.compile`` backend with ``options``, recording ``partition_stats`` of every
    graph it compiles into ``stats`` (one entry per graph dynamo hands it; more than one means graph breaks)."""
    from torch_tensorrt.dynamo.backend.backends import torch_tensorrt_backend

    def backend(gm: Any, sample_inputs: Any) -> Any:
        compiled = torch_tensorrt_backend(gm, sample_inputs, options=options)
        stats.append(partition_stats(compiled))
        return compiled

    return backend


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0][:160] if text else ''}"


def ort_tensorrt_row(model_name: str | None = None, prompt: str = DEFAULT_PROMPT, new_tokens: int = 32,
                     repeats: int = 3, ref: Any = None) -> dict[str, Any]:
    """ONNX Runtime's TensorrtExecutionProvider on the exported model (an engine cache and shape profiles,
    CUDA for what TensorRT does not take): one row, whose ``status`` says why when it cannot run here."""
    from . import generation, quality

    cap = capability("ort-tensorrt")
    row: dict[str, Any] = {"engine": "ONNX Runtime + TensorRT EP (fp16 allowed)", "status": cap.reason or "ok"}
    if not cap.available:
        return row
    try:
        built = load_ort("all", model_name, provider="TensorrtExecutionProvider")
        d = generation.measure_decode(built["model"], built["tokenizer"], new_tokens=new_tokens, repeats=repeats,
                                      prompt=prompt)
        row.update(build_s=built["build_s"], ttft_s=d["ttft_s"], decode_tokens_per_s=d["decode_tokens_per_s"],
                   providers=built["providers"])
        if ref is not None:
            q = quality.compare(built["model"], ref)
            row.update(agreement=q.agreement, kl=q.kl)
    except Exception as exc:
        if not env.backend_failure(exc):
            raise  # a bug in the lab, not TensorRT failing here
        row["status"] = f"failed: {_first_line(exc)}"
    return row


def torch_tensorrt_row(model_name: str | None = None, prompt: str = DEFAULT_PROMPT, new_tokens: int = 32,
                       repeats: int = 3, ref: Any = None, min_block_size: int = 1) -> dict[str, Any]:
    """torch-tensorrt as a torch.compile backend for the fp16 decode step (``min_block_size``): one row with
    ``trt_engines`` and ``torch_ops``, how much ran in TensorRT and how much stayed in PyTorch. A step where
    TensorRT built no engine is a failed row: it ran entirely in PyTorch."""
    from . import models

    cap = capability("torch-tensorrt")
    row: dict[str, Any] = {"engine": "torch.compile backend=tensorrt (torch-tensorrt)", "status": cap.reason or "ok"}
    if not cap.available:
        return row
    try:
        import torch

        lm = models.load(model_name, dtype="fp16")
        ids = models.chat_inputs(lm.tokenizer, prompt, device=lm.device)["input_ids"]
        stats: list[dict[str, int]] = []
        backend = tensorrt_backend(torch_tensorrt_options(torch.float16, min_block_size), stats)
        dec = StaticDecoder(lm.model, compile=True, backend=backend, fresh_cache=False)
        m = measure_decoder(dec, ids, new_tokens, repeats)
        engines_built = sum(st["trt_engines"] for st in stats)
        row.update(build_s=m["build_s"], ttft_s=m["ttft_s"], decode_tokens_per_s=m["decode_tokens_per_s"],
                   graphs=len(stats), trt_engines=engines_built, torch_ops=sum(st["torch_ops"] for st in stats),
                   min_block_size=min_block_size)
        if not engines_built:
            row["status"] = "failed: TensorRT built no engine; the whole decode step ran in PyTorch"
        if ref is not None:
            q = decoder_quality(dec, ref)
            row.update(agreement=q.agreement, kl=q.kl)
    except Exception as exc:
        if not env.backend_failure(exc):
            raise  # a bug in the lab, not TensorRT failing here
        row["status"] = f"failed: {_first_line(exc)}"
    return row


def tensorrt_rows(model_name: str | None = None, prompt: str = DEFAULT_PROMPT, new_tokens: int = 32,
                  repeats: int = 3, ref: Any = None, min_block_size: int = 1) -> list[dict[str, Any]]:
    """TensorRT rows where it can run: ``ort_tensorrt_row`` and ``torch_tensorrt_row``. A row per path; when a
    path cannot run here its ``status`` says why (no GPU, not installed, a provider fallback, or the error)."""
    return [ort_tensorrt_row(model_name, prompt, new_tokens, repeats, ref),
            torch_tensorrt_row(model_name, prompt, new_tokens, repeats, ref, min_block_size)]


# ------------------------------------------------------------------------------------ GPU engines: vLLM


def hf_offline(lm: Any, prompts: Sequence[str], max_tokens: int = 64) -> dict[str, Any]:
    """The baseline for ``vllm_offline``: transformers ``generate`` on all prompts as one left-padded batch,
    exactly ``max_tokens`` tokens each."""
    from .generation import generate

    generate(lm.model, lm.tokenizer, list(prompts[:1]), max_new_tokens=2, fixed_length=True)  # warmup
    out = generate(lm.model, lm.tokenizer, list(prompts), max_new_tokens=max_tokens, fixed_length=True)
    return {"engine": f"transformers generate ({lm.dtype})", "requests": len(prompts),
            "output_tokens": out.n_out * out.batch, "wall_s": out.e2e_s, "output_tokens_per_s": out.output_tokens_per_s}


VLLM_GPU_MEMORY_UTILIZATION = 0.5  # vLLM's share of the GPU: room for this process's own CUDA context and tensors


def _check_fraction(gpu_memory_utilization: float) -> None:
    if not 0 < gpu_memory_utilization < 1:
        raise ValueError(f"gpu_memory_utilization={gpu_memory_utilization}: a fraction of the GPU's memory "
                         "strictly between 0 and 1 (vLLM reserves this share for weights and KV cache)")


def shutdown_vllm(llm: Any) -> None:
    """Stop a ``vllm.LLM``'s engine (its worker processes and their GPU memory) now, not whenever garbage
    collection gets to it, then tear down vLLM's distributed state so the next engine can start."""
    engine = getattr(llm, "llm_engine", None)
    core = getattr(engine, "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()
    with contextlib.suppress(ImportError):
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    gc.collect()


def vllm_offline(model_path: str, prompt_ids: Sequence[Sequence[int]], max_tokens: int = 64, dtype: str = "float16",
                 tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION) -> dict[str, Any]:
    """Offline throughput of ``vllm.LLM(model, dtype=...)``: every prompt submitted at once, greedy,
    exactly ``max_tokens`` tokens each (ignore_eos). ``prompt_ids`` are chat-formatted token ids, made
    before the clock starts, as ``hf_offline``'s are: neither side times tokenisation. vLLM may take
    ``gpu_memory_utilization`` of each GPU's memory; the engine is shut down before this returns, so the
    next one starts on a free GPU. Needs a GPU and vllm."""
    _check_fraction(gpu_memory_utilization)
    cap = capability("vllm")
    if not cap.available:
        raise ValueError(f"vLLM cannot run here: {cap.reason}")
    from vllm import LLM, SamplingParams

    t0 = clock()  # vLLM's engine runs in its own processes and returns finished work: the host clock times it
    llm = LLM(model=model_path, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
              gpu_memory_utilization=gpu_memory_utilization)
    try:
        load_s = clock() - t0
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        tokens_prompts = [{"prompt_token_ids": [int(i) for i in ids]} for ids in prompt_ids]  # vLLM's TokensPrompt
        llm.generate(tokens_prompts[:1], params, use_tqdm=False)  # warmup
        t0 = clock()
        outs = llm.generate(tokens_prompts, params, use_tqdm=False)
        wall = clock() - t0
    finally:
        shutdown_vllm(llm)
        del llm
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    return {"engine": f"vLLM offline (tp={tensor_parallel_size})", "requests": len(prompt_ids), "output_tokens": n_out,
            "wall_s": wall, "output_tokens_per_s": n_out / wall, "load_s": load_s,
            "gpu_memory_utilization": gpu_memory_utilization, "texts": [o.outputs[0].text for o in outs]}


def release_gpu(lm: Any) -> None:
    """Move a loaded model (``models.Loaded``) to the CPU and return its GPU memory, so an engine started next
    (vLLM) finds the GPU free. The model stays usable on the CPU."""
    from . import memory

    lm.model.to("cpu")
    lm.device = "cpu"
    memory.free()


def vllm_rows(lm: Any, prompts: Sequence[str], max_tokens: int = 64, max_concurrency: int = 16,
              gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION) -> list[dict[str, Any]]:
    """transformers ``generate`` (``hf_offline``) against vLLM on the same prompts, one engine at a time:
    the HF model is moved off the GPU first (``release_gpu``), each ``vllm.LLM`` is shut down before the next
    (tp=1, then tp=2 on two or more GPUs), and ``vllm serve`` starts last, driven by ``labkit.loadgen``."""
    from . import loadgen

    _check_fraction(gpu_memory_utilization)
    cap = capability("vllm")
    if not cap.available:
        raise ValueError(f"vLLM cannot run here: {cap.reason}")
    from .scheduler import chat_ids

    path = models_path(lm)
    ids = [chat_ids(lm.tokenizer, p) for p in prompts]  # the same chat-formatted tokens hf_offline feeds generate
    rows = [hf_offline(lm, prompts, max_tokens)]
    release_gpu(lm)
    rows.append(vllm_offline(path, ids, max_tokens, gpu_memory_utilization=gpu_memory_utilization))
    if gpu_count() >= 2:
        rows.append(vllm_offline(path, ids, max_tokens, tensor_parallel_size=2,
                                 gpu_memory_utilization=gpu_memory_utilization))
    with vllm_server(path, gpu_memory_utilization=gpu_memory_utilization) as url:
        served = loadgen.run(url, list(prompts), num_requests=len(prompts), max_concurrency=max_concurrency,
                             max_tokens=max_tokens)
    rows.append({"engine": "vllm serve + labkit.loadgen", **served.summary()})
    return [{k: v for k, v in r.items() if k != "texts"} for r in rows]


def models_path(lm: Any) -> str:
    """The local directory or hub id vLLM should load for a ``models.Loaded`` model."""
    from . import models

    name = getattr(lm, "name", None)
    return models.resolve(None if name in (None, models.display_name(None)) else name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def vllm_server(model_path: str, dtype: str = "float16", tensor_parallel_size: int = 1,
                startup_timeout_s: float = 600.0, extra_args: Sequence[str] = (),
                gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION) -> Iterator[str]:
    """``vllm serve MODEL --dtype float16 --gpu-memory-utilization F`` in a child process on a free local port;
    yields its URL once /health answers, and stops it (and its GPU memory) afterwards. Drive it with
    ``labkit.loadgen.run(url, ...)``."""
    _check_fraction(gpu_memory_utilization)
    cap = capability("vllm")
    if not cap.available:
        raise ValueError(f"vLLM cannot run here: {cap.reason}")
    port = _free_port()
    exe = shutil.which("vllm") or str(Path(sys.executable).with_name("vllm"))
    argv = [exe, "serve", model_path, "--dtype", dtype, "--host", "127.0.0.1", "--port", str(port),
            "--tensor-parallel-size", str(tensor_parallel_size),
            "--gpu-memory-utilization", str(gpu_memory_utilization), *extra_args]
    log = tempfile.NamedTemporaryFile(prefix="labkit-vllm-", suffix=".log", delete=False)
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"`{' '.join(argv)}` exited with {proc.returncode}; log: {log.name}")
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve did not answer /health within {startup_timeout_s:.0f} s; log: {log.name}")
            time.sleep(2)
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
