"""The GPU preflight (``make gpu-check``): every CUDA path the notebooks take, run once, small, on this machine.

An instructor runs it on the workshop's GPU machine a week before. Each check loads what its notebook
loads and runs a few tokens through it: fp16 and bf16 load and decode, bitsandbytes int8 and NF4, ONNX
Runtime on the CUDA provider (and dynamic int8 labelled as the CPU provider's), SDPA and FlashAttention,
the static cache with ``torch.compile``, the profiler, the server at ``max_batch_size`` 1 and 8, and
vLLM, ONNX Runtime's TensorRT provider and torch-tensorrt where installed; ``tp`` starts ``vllm serve
--tensor-parallel-size 2`` from vLLM's environment where two GPUs are visible. One line per check:

    PASS  fp16 load + decode       (12.3 s) 8 tokens at 105.2 tokens/s: 'The capital of France is Paris.'
    SKIP  bf16 load + decode       Tesla T4 (compute capability 7.5) has no native bf16: it needs an Ampere GPU …
    FAIL  onnxruntime CUDA provider asked ONNX Runtime for CUDAExecutionProvider, the session got [...]

then one JSON document as the last line (also written to ``--json``, default build/gpu-check.json). The
exit status is 1 when a check failed, 0 otherwise. On a machine without CUDA it says so in one line and
exits 0; when nvidia-smi sees a GPU that torch cannot use, that is a failure (exit 1). The runner (a thread per
check, the budget and the deadline) and the record each check leaves are ``labkit.preflight``'s, shared with
``make doctor``; this module holds the checks.

    python -m labkit gpu-check [--json build/gpu-check.json] [--only fp16 server] [--budget-s 420] [--deadline-s 570]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from . import preflight
from .core import config, env, memory, results, timing
from .decoding import cache_variants, generation, kv, profiling
from .engines import tensorrt
from .model import models, onnx, parallel, prompts
from .precision import variants
from .preflight import DEFAULT_BUDGET_S, DEFAULT_DEADLINE_S, Check, CheckResult, Skip
from .serve import launch, loadgen
from .serve.vllm import offline as vllm
from .serve.vllm import server as vllm_server

DEFAULT_JSON = config.REPO_DIR / "build" / "gpu-check.json"
PROMPT = "What is the capital of France? Answer in one sentence."
TOKENS = 8  # new tokens per decode check


@dataclass
class Context:
    """What the checks share: the device, the model, and one fp16 copy of it loaded once."""

    device: str
    model_name: str | None = None
    prompts: list[str] = field(default_factory=list)
    _fp16: Any = None

    def fp16(self) -> Any:
        """The model in fp16 on the device (``models.Loaded``), loaded on first use."""
        if self._fp16 is None:
            self._fp16 = models.load(self.model_name, dtype="fp16", device=self.device)
        return self._fp16

    def release(self) -> None:
        """Drop the shared model and hand its GPU memory back (before vLLM or TensorRT take the GPU)."""
        self._fp16 = None
        memory.free(self.device)


def summary(done: Sequence[CheckResult], **extra: Any) -> dict[str, Any]:
    """The JSON report: counts per status, every check, plus ``extra`` (environment, device, wall time)."""
    n = {status.lower(): count for status, count in preflight.counts(done).items()}
    return {"ok": n["fail"] == 0, **n, "checks": [asdict(r) for r in done], **extra}


# ------------------------------------------------------------------------------------------ the checks


def _decode(lm: Any, prompt: str = PROMPT, tokens: int = TOKENS) -> str:
    r = generation.generate(lm.model, lm.tokenizer, prompt, max_new_tokens=tokens, fixed_length=True)
    if r.n_out != tokens:
        raise AssertionError(f"asked for {tokens} tokens, got {r.n_out}")
    rate = f"{r.decode_tokens_per_s:.1f} tokens/s" if r.decode_tokens_per_s else "one token"
    return f"{r.n_out} tokens at {rate}: {r.text[:50]!r}"


def check_cuda(ctx: Context) -> str:
    import torch

    index = env.cuda_index(ctx.device)
    major, minor = torch.cuda.get_device_capability(index)
    x = torch.randn(256, 256, device=ctx.device)
    y = (x @ x).sum().item()  # a kernel ran and its result came back
    assert y == y, "a matmul on the GPU returned NaN"
    return (f"{torch.cuda.get_device_name(index)}, compute capability {major}.{minor}, torch {torch.__version__} "
            f"(CUDA {torch.version.cuda}), {torch.cuda.device_count()} GPU(s) visible")


def check_nvml(ctx: Context) -> str:
    import torch

    reading = memory.nvml_used(ctx.device)
    if reading.bytes is None:
        raise Skip(reading.reason)
    total = torch.cuda.get_device_properties(env.cuda_index(ctx.device)).total_memory
    if not 0 < reading.bytes <= total:
        raise AssertionError(f"NVML says {reading.bytes} bytes in use on a {total}-byte GPU: wrong device?")
    kind, key = memory.nvml_target(ctx.device)
    return f"{reading.mib:.0f} MiB in use on the GPU CUDA calls {ctx.device} (NVML {kind} {key})"


def check_fp16(ctx: Context) -> str:
    lm = ctx.fp16()
    return f"loaded in {lm.load_seconds:.1f} s; " + _decode(lm)


def check_bf16(ctx: Context) -> str:
    cap = env.bf16(ctx.device)
    if not cap.available:
        raise Skip(cap.reason)
    lm = models.load(ctx.model_name, dtype="bf16", device=ctx.device)
    try:
        return _decode(lm)
    finally:
        del lm
        memory.free(ctx.device)


def _variant_check(name: str) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        v = variants.load_variant(name, ctx.model_name, ctx.device)
        try:
            if not v.ok:
                raise RuntimeError(v.status)
            where = f"{v.backend} on {v.device}" + (f" ({v.providers[0]})" if v.providers else "")
            return f"{where}, {v.weight_bytes / 2**20:.0f} MiB; " + _decode(v)
        finally:
            v.release()
            memory.free(ctx.device)

    return run


def check_ort_cuda(ctx: Context) -> str:
    problem = onnx.cuda_provider_reason()
    if problem:
        raise RuntimeError(problem)
    v = variants.load_variant("ort-fp32", ctx.model_name, ctx.device, provider="CUDAExecutionProvider")
    try:
        if not v.ok:
            raise RuntimeError(v.status)
        if v.providers[:1] != ["CUDAExecutionProvider"]:
            raise AssertionError(f"asked ONNX Runtime for CUDAExecutionProvider, the session got {v.providers}")
        return f"{v.providers[0]} on {v.device}, {v.weight_bytes / 2**20:.0f} MiB; " + _decode(v)
    finally:
        v.release()
        memory.free(ctx.device)


def check_ort_int8_label(ctx: Context) -> str:
    v = variants.load_variant("ort-int8-channel", ctx.model_name, ctx.device)
    try:
        if not v.ok:
            raise RuntimeError(v.status)
        if v.providers[:1] != ["CPUExecutionProvider"] or v.device != "cpu" or not v.note:
            raise AssertionError(f"dynamic int8 should run on the CPU provider and say so; got device {v.device}, "
                                 f"providers {v.providers}, note {v.note!r}")
        return "labelled as the CPU provider's, with the reason; " + _decode(v, tokens=4)
    finally:
        v.release()


def check_ort_tensorrt(ctx: Context) -> str:
    row = tensorrt.ort_tensorrt_row(ctx.model_name, new_tokens=TOKENS, repeats=1)
    if row["status"] != "ok":
        raise RuntimeError(row["status"])
    return (f"providers {row['providers']}, session built in {row['build_s']:.1f} s (engine cached for next time), "
            f"{row['decode_tokens_per_s']:.1f} tokens/s")


def _attention_check(impl: str) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        lm = ctx.fp16()
        row = kv.compare_attention(lm.model, lm.tokenizer, [impl], prompt_tokens=128, new_tokens=4, repeats=1)[0]
        return f"TTFT {row['ttft_s'] * 1e3:.1f} ms on 128 prompt tokens, TPOT {row['tpot_s'] * 1e3:.2f} ms"

    return run


def check_compile(ctx: Context) -> str:
    lm = ctx.fp16()
    eager = generation.generate(lm.model, lm.tokenizer, PROMPT, max_new_tokens=TOKENS, fixed_length=True)
    with timing.track(lm.device) as t:
        first = generation.generate(lm.model, lm.tokenizer, PROMPT, max_new_tokens=TOKENS, fixed_length=True,
                                    **cache_variants.cache_variant_kwargs("static+compile"))
    first_s = t.seconds
    again = generation.generate(lm.model, lm.tokenizer, PROMPT, max_new_tokens=TOKENS, fixed_length=True,
                                **cache_variants.cache_variant_kwargs("static+compile"))
    same = "same greedy text as eager" if again.text == eager.text else "greedy text differs from eager (fp16 rounding)"
    return f"first call (compiles) {first_s:.1f} s, then TPOT {again.tpot_s * 1e3:.2f} ms; {same} [{first.n_out} tokens]"


def check_profiler(ctx: Context) -> str:
    lm = ctx.fp16()
    prefill, decode = profiling.profile_prefill_decode(lm.model, lm.tokenizer, prompt_tokens=32)
    if decode.device_kind != "cuda" or decode.total_us <= 0:
        raise AssertionError(f"the profiler recorded no GPU kernel time ({decode.device_kind})")
    groups = decode.groups().set_index("group")["share"]
    return (f"decode step: {decode.total_us:.0f} µs of GPU kernel time over {len(decode.ops)} operators "
            f"(matmul {groups['matmul']:.0%}, attention {groups['attention']:.0%})")


def _server_check(max_batch_size: int) -> Callable[[Context], str]:
    def run(ctx: Context) -> str:
        lm = ctx.fp16()
        n = 2 * max(max_batch_size, 4)
        with launch.start_server(lm, max_batch_size=max_batch_size) as srv:
            res = loadgen.run(srv.url, ctx.prompts or [PROMPT], num_requests=n, max_concurrency=max(max_batch_size, 4),
                              max_tokens=TOKENS, endpoint="chat")
            stats = srv.stats()
        s = res.summary()
        if s["completed"] != n or s["failed"]:
            raise AssertionError(f"{s['completed']} of {n} requests completed, {s['failed']} failed: {s['errors']}")
        return (f"{n} streamed requests, {s['request_throughput']:.1f} requests/s, "
                f"mean batch {stats.get('mean_batch_size', float('nan')):.1f}")

    return run


def check_vllm(ctx: Context) -> str:
    row = _vllm_tokens(ctx)
    return f"{row['output_tokens']} tokens in {row['wall_s']:.2f} s after a {row['load_s']:.0f} s start; engine shut down"


def _fp8_path(ctx: Context) -> str:
    """How vLLM's FP8 runs on this GPU (``vllm.fp8_path`` of its compute capability); ``Skip`` below 8.0."""
    import torch

    try:
        return vllm.fp8_path(torch.cuda.get_device_capability(ctx.device))
    except ValueError as exc:
        raise Skip(str(exc)) from None


def _vllm_tokens(ctx: Context, **options: Any) -> dict[str, Any]:
    ctx.release()  # vLLM reserves its share of the GPU: nothing else of ours may hold memory there
    tok = models.load_tokenizer(ctx.model_name)
    ids = [models.chat_ids(tok, p) for p in (ctx.prompts or [PROMPT])[:4]]
    # in a process of its own: vLLM installs signal handlers, which only a main thread may do
    return launch.run_in_child(vllm.vllm_offline, models.resolve(ctx.model_name), ids, device=ctx.device,
                               max_tokens=TOKENS, gpu_memory_utilization=0.3, **options)  # the child sees device's GPU


def check_fp8(ctx: Context) -> str:
    """``vllm.LLM(quantization="fp8")`` against the same prompts in fp16: which path ran (from the GPU's compute
    capability), its tokens, and how many equal fp16's."""
    path = _fp8_path(ctx)
    reference, row = _vllm_tokens(ctx), _vllm_tokens(ctx, quantization="fp8")
    return f"{path}; {row['output_tokens']} tokens, {vllm.same_tokens(row, reference)}"


def check_fp8_kv(ctx: Context) -> str:
    """``vllm.LLM(kv_cache_dtype="fp8")``: an FP8 KV cache (half of fp16's bytes per token), tokens against fp16's."""
    _fp8_path(ctx)  # an FP8 KV cache needs what FP8 weights need: compute capability 8.0 on
    reference, row = _vllm_tokens(ctx), _vllm_tokens(ctx, kv_cache_dtype="fp8")
    return f"FP8 KV cache; {row['output_tokens']} tokens, {vllm.same_tokens(row, reference)}"


def check_tp(ctx: Context) -> str:
    """``vllm serve --tensor-parallel-size 2`` (notebook 11): two GPUs, vLLM's environment, a model whose heads
    split in two; four streamed requests through it."""
    import torch

    visible = torch.cuda.device_count()
    if visible < 2:
        raise Skip(f"tensor parallelism over 2 GPUs needs 2 visible; {visible} here")
    if not vllm_server.vllm_python().exists():
        raise Skip(vllm_server.MISSING)
    model = models.resolve(ctx.model_name)
    why_not = parallel.tp_plan(model, "fp16", degrees=(2,))[0]["why_not"]
    if why_not:
        raise Skip(f"{why_not}; set LABKIT_MODEL to a model whose heads divide by 2 (e.g. Qwen/Qwen2.5-1.5B-Instruct)")
    ctx.release()  # vLLM takes its share of both GPUs
    s = vllm_server.Settings(model=model, dtype="float16", device="cuda", tensor_parallel_size=2,
                             gpu_memory_utilization=0.3, max_model_len=1024)
    with vllm_server.serve(s, deadline_s=420, name="vllm-tp2") as srv:
        run = loadgen.run(srv.url, ctx.prompts or [PROMPT], num_requests=4, max_concurrency=4, max_tokens=TOKENS,
                          endpoint="chat")
    summary = run.summary()
    if summary["completed"] != 4:
        raise AssertionError(f"{summary['completed']} of 4 requests completed: {summary['errors']}")
    return (f"vllm serve --tensor-parallel-size 2 started in {srv.start_s:.0f} s; 4 streamed requests, "
            f"{summary['output_tokens_per_s']:.1f} output tokens/s")


def check_torch_tensorrt(ctx: Context) -> str:
    ctx.release()
    row = tensorrt.torch_tensorrt_row(ctx.model_name, new_tokens=TOKENS, repeats=1)
    if row["status"] != "ok":
        raise RuntimeError(row["status"])
    return (f"{row['trt_engines']} TensorRT engine(s), {row['torch_ops']} operator(s) left to PyTorch, "
            f"build {row['build_s']:.1f} s, {row['decode_tokens_per_s']:.1f} tokens/s")


def checks() -> list[Check]:
    """Every check, in the order they run (the ones that take the whole GPU last)."""
    return [
        Check("cuda", check_cuda),
        Check("nvml (CUDA_VISIBLE_DEVICES)", check_nvml, ("nvml",)),
        Check("fp16 load + decode", check_fp16),
        Check("bf16 load + decode", check_bf16),
        Check("bitsandbytes int8", _variant_check("bnb-int8"), ("bitsandbytes",)),
        Check("bitsandbytes nf4", _variant_check("bnb-nf4"), ("bitsandbytes",)),
        Check("onnxruntime CUDA provider", check_ort_cuda, ("onnxruntime", "onnx-export")),
        Check("onnxruntime int8 label", check_ort_int8_label, ("onnxruntime", "onnx-export")),
        Check("attention sdpa", _attention_check("sdpa")),
        Check("attention flash_attention_2", _attention_check("flash_attention_2"), ("flash-attn",)),
        Check("static cache + torch.compile", check_compile, ("torch.compile",)),
        Check("profiler", check_profiler),
        Check("server max_batch_size=1", _server_check(1)),
        Check("server max_batch_size=8", _server_check(8)),
        Check("onnxruntime TensorRT provider", check_ort_tensorrt, ("ort-tensorrt",)),
        Check("torch-tensorrt", check_torch_tensorrt, ("torch-tensorrt",)),
        Check("tp (vllm serve --tensor-parallel-size 2)", check_tp),
        Check("vllm", check_vllm, ("vllm-offline",)),
        Check("fp8 (vllm --quantization fp8)", check_fp8, ("vllm-offline",)),
        Check("fp8-kv (vllm --kv-cache-dtype fp8)", check_fp8_kv, ("vllm-offline",)),
    ]


def main(argv: list[str] | None = None, all_checks: Sequence[Check] | None = None, out: TextIO | None = None,
         exit_on_hang: bool = False) -> int:
    """The preflight; ``exit_on_hang`` (the command line's) ends the process at once when a check hung, once
    its report is written, rather than waiting at exit for the hung check's thread."""
    ap = argparse.ArgumentParser(prog="python -m labkit gpu-check", description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"where the JSON report goes (default {DEFAULT_JSON})")
    ap.add_argument("--only", nargs="*", default=None, help="run the checks whose name contains one of these words")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="skip checks not started by then")
    ap.add_argument("--deadline-s", type=float, default=DEFAULT_DEADLINE_S,
                    help="a check still running then is a FAIL and the run ends")
    ap.add_argument("--model", default=None, help="model to check with (default: LABKIT_MODEL or the default model)")
    args = ap.parse_args(argv)
    out = out or sys.stdout
    if args.budget_s <= 0:
        ap.error(f"--budget-s must be positive, got {args.budget_s}")
    if args.deadline_s <= 0:
        ap.error(f"--deadline-s must be positive, got {args.deadline_s}")
    all_checks = list(all_checks) if all_checks is not None else checks()
    try:
        chosen = preflight.select(all_checks, args.only)
    except ValueError as exc:
        ap.error(str(exc))
    import torch

    problem = env.torch_gpu_reason()
    if problem or not torch.cuda.is_available():
        cuda = env.capability("cuda")
        line = (f"gpu-check: FAIL: {problem}" if problem else
                f"gpu-check: no CUDA device here ({cuda.reason}); nothing to check")
        results.write_json_atomic(args.json, {"ok": not problem, "cuda": False, "reason": problem or cuda.reason,
                                              "checks": [], "environment": env.environment()})
        print(line, file=out, flush=True)
        return 1 if problem else 0
    device = env.device()
    if not device.startswith("cuda"):
        device = "cuda"  # LABKIT_DEVICE=cpu says where notebooks run; the preflight checks the GPU regardless
    ctx = Context(device=device, model_name=args.model, prompts=_prompts())
    t0 = time.monotonic()
    done = preflight.run_checks(chosen, ctx, args.budget_s, out=out, deadline_s=args.deadline_s)
    hung = any(r.detail.startswith("still running after") for r in done)
    if not hung:  # a hung check's thread may still hold the model: releasing could wait on it
        ctx.release()
    report = summary(done, cuda=True, device=device, wall_s=time.monotonic() - t0, environment=env.environment())
    results.write_json_atomic(args.json, report)
    print(json.dumps(results.jsonable(report)), file=out, flush=True)
    code = 0 if report["ok"] else 1
    if hung and exit_on_hang:
        out.flush()
        os._exit(code)  # the report is written; do not wait at exit for the hung check's thread
    return code


def command(argv: list[str]) -> int:
    """``python -m labkit gpu-check``."""
    return main(argv, exit_on_hang=True)


def _prompts() -> list[str]:
    return list(prompts.load_prompts("questions"))

