"""TensorRT two ways: ONNX Runtime's TensorRT execution provider on the exported model, and torch-tensorrt as a
``torch.compile`` backend. Each row says how much ran in TensorRT, or, when it cannot run here, the reason
``labkit.core.env.capability`` gives.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..core import env
from ..decoding import generation, quality
from ..model import models
from .compiled import DEFAULT_PROMPT, StaticDecoder, decoder_quality, measure_decoder
from .onnxruntime import load_ort

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


@contextlib.contextmanager
def _failure_in(row: dict[str, Any]) -> Iterator[None]:
    """Run a TensorRT row's block: a backend failing here (``env.backend_failure``) becomes the row's status;
    anything else is a bug in the lab and propagates."""
    try:
        yield
    except Exception as exc:
        if not env.backend_failure(exc):
            raise
        row["status"] = f"failed: {_first_line(exc)}"


def ort_tensorrt_row(model_name: str | None = None, prompt: str = DEFAULT_PROMPT, new_tokens: int = 32,
                     repeats: int = 3, ref: Any = None) -> dict[str, Any]:
    """ONNX Runtime's TensorrtExecutionProvider on the exported model (an engine cache and shape profiles,
    CUDA for what TensorRT does not take): one row, whose ``status`` says why when it cannot run here."""
    cap = env.capability("ort-tensorrt")
    row: dict[str, Any] = {"engine": "ONNX Runtime + TensorRT EP (fp16 allowed)", "status": cap.reason or "ok"}
    if not cap.available:
        return row
    with _failure_in(row):
        built = load_ort("all", model_name, provider="TensorrtExecutionProvider")
        d = generation.measure_decode(built["model"], built["tokenizer"], new_tokens=new_tokens, repeats=repeats,
                                      prompt=prompt)
        row.update(build_s=built["build_s"], ttft_s=d["ttft_s"], decode_tokens_per_s=d["decode_tokens_per_s"],
                   providers=built["providers"])
        if ref is not None:
            q = quality.compare(built["model"], ref)
            row.update(agreement=q.agreement, kl=q.kl)
    return row


def torch_tensorrt_row(model_name: str | None = None, prompt: str = DEFAULT_PROMPT, new_tokens: int = 32,
                       repeats: int = 3, ref: Any = None, min_block_size: int = 1) -> dict[str, Any]:
    """torch-tensorrt as a torch.compile backend for the fp16 decode step (``min_block_size``): one row with
    ``trt_engines`` and ``torch_ops``, how much ran in TensorRT and how much stayed in PyTorch. A step where
    TensorRT built no engine is a failed row: it ran entirely in PyTorch."""
    cap = env.capability("torch-tensorrt")
    row: dict[str, Any] = {"engine": "torch.compile backend=tensorrt (torch-tensorrt)", "status": cap.reason or "ok"}
    if not cap.available:
        return row
    with _failure_in(row):
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
    return row


def tensorrt_rows(model_name: str | None = None, prompt: str = DEFAULT_PROMPT, new_tokens: int = 32,
                  repeats: int = 3, ref: Any = None, min_block_size: int = 1) -> list[dict[str, Any]]:
    """TensorRT rows where it can run: ``ort_tensorrt_row`` and ``torch_tensorrt_row``. A row per path; when a
    path cannot run here its ``status`` says why (no GPU, not installed, a provider fallback, or the error)."""
    return [ort_tensorrt_row(model_name, prompt, new_tokens, repeats, ref),
            torch_tensorrt_row(model_name, prompt, new_tokens, repeats, ref, min_block_size)]
