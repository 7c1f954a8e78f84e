"""vLLM itself, beside transformers' ``generate`` on the same prompts.

``vllm_offline`` runs vLLM's ``LLM`` on token ids made before the clock starts; ``serve_here`` starts
``vllm serve`` from this environment's vLLM (``labkit.serve.vllm.server`` starts it from ``.venv-vllm``); ``vllm_rows`` runs transformers and vLLM one engine at a time,
freeing the GPU between them. Whether vLLM can run in this process is ``labkit.core.env.capability("vllm-offline")``'s answer (a GPU
environment that imports vllm); ``capability("vllm")`` says whether ``vllm serve`` can run as a child.
"""
from __future__ import annotations

import contextlib
import gc
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ...core import env, gpu_features
from ...core.timing import clock
from ...decoding import generation
from ...decoding.quality import equal_tokens, until_eos
from ...model import models
from ...model.models import chat_ids, release_gpu
from .. import decoder, loadgen
from . import server as vs

# ------------------------------------------------------------------------------------ vLLM in this process (a GPU environment)


def hf_offline(lm: Any, prompts: Sequence[str], max_tokens: int = 64) -> dict[str, Any]:
    """The baseline for ``vllm_offline``: transformers ``generate`` on all prompts as one left-padded batch,
    exactly ``max_tokens`` tokens each."""
    generation.generate(lm.model, lm.tokenizer, list(prompts[:1]), max_new_tokens=2, fixed_length=True)  # warmup
    out = generation.generate(lm.model, lm.tokenizer, list(prompts), max_new_tokens=max_tokens, fixed_length=True)
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


def fp8_path(capability: tuple[int, int]) -> str:
    """How vLLM's ``quantization="fp8"`` runs on a GPU of compute ``capability``; ``ValueError`` below 8.0."""
    name = gpu_features.capability_text(capability)
    if gpu_features.has("fp8", capability):
        return f"W8A8 FP8 on FP8 tensor cores ({name}): weights per channel, activations per token"
    if gpu_features.has("fp8_marlin", capability):
        return (f"weight-only FP8 through vLLM's Marlin kernel ({name} has no FP8 tensor cores: the weights are "
                "upcast to 16 bits for each matmul, so memory is saved and no FLOP/s gained)")
    raise ValueError(f"{gpu_features.why_not('fp8_marlin', capability)}, and {gpu_features.needs('fp8')} for FP8 "
                     "tensor cores")


def same_tokens(row: dict[str, Any], reference: dict[str, Any]) -> str:
    """How many of two ``vllm_offline`` runs' output tokens are equal, position by position."""
    same, compared = equal_tokens(row["token_ids"], reference["token_ids"])
    return f"{same} of {compared} tokens as vLLM's fp16 run"


def vllm_offline(model_path: str, prompt_ids: Sequence[Sequence[int]], max_tokens: int = 64, dtype: str = "float16",
                 tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION, quantization: str | None = None,
                 kv_cache_dtype: str = "auto") -> dict[str, Any]:
    """Offline throughput of ``vllm.LLM(model, dtype=...)``: every prompt submitted at once, greedy,
    exactly ``max_tokens`` tokens each (ignore_eos). ``prompt_ids`` are chat-formatted token ids, made
    before the clock starts, as ``hf_offline``'s are: neither side times tokenisation. vLLM may take
    ``gpu_memory_utilization`` of each GPU's memory; the engine is shut down before this returns, so the
    next one starts on a free GPU. ``quantization`` ("fp8": vLLM quantises the weights at load) and
    ``kv_cache_dtype`` ("fp8") go to ``vllm.LLM`` as given. Needs a GPU and vllm."""
    _check_fraction(gpu_memory_utilization)
    cap = env.capability("vllm-offline")
    if not cap.available:
        raise ValueError(f"vLLM cannot run here: {cap.reason}")
    from vllm import LLM, SamplingParams

    t0 = clock()  # vLLM's engine runs in its own processes and returns finished work: the host clock times it
    llm = LLM(model=model_path, dtype=dtype, tensor_parallel_size=tensor_parallel_size,
              gpu_memory_utilization=gpu_memory_utilization, quantization=quantization, kv_cache_dtype=kv_cache_dtype)
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
            "gpu_memory_utilization": gpu_memory_utilization, "quantization": quantization,
            "kv_cache_dtype": kv_cache_dtype, "texts": [o.outputs[0].text for o in outs],
            "token_ids": [list(o.outputs[0].token_ids) for o in outs]}


def vllm_rows(lm: Any, prompts: Sequence[str], max_tokens: int = 64, max_concurrency: int = 16,
              gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION) -> list[dict[str, Any]]:
    """transformers ``generate`` (``hf_offline``) against vLLM on the same prompts, one engine at a time:
    the HF model is moved off the GPU first (``release_gpu``), each ``vllm.LLM`` is shut down before the next
    (tp=1, then tp=2 on two or more GPUs), and ``vllm serve`` starts last, driven by ``labkit.serve.loadgen``."""
    _check_fraction(gpu_memory_utilization)
    cap = env.capability("vllm-offline")
    if not cap.available:
        raise ValueError(f"vLLM cannot run here: {cap.reason}")
    path = models_path(lm)
    ids = [chat_ids(lm.tokenizer, p) for p in prompts]  # the same chat-formatted tokens hf_offline feeds generate
    rows = [hf_offline(lm, prompts, max_tokens)]
    release_gpu(lm)
    rows.append(vllm_offline(path, ids, max_tokens, gpu_memory_utilization=gpu_memory_utilization))
    if gpu_count() >= 2:
        rows.append(vllm_offline(path, ids, max_tokens, tensor_parallel_size=2,
                                 gpu_memory_utilization=gpu_memory_utilization))
    with serve_here(path, gpu_memory_utilization=gpu_memory_utilization) as url:
        # the offline rows' chat-formatted token ids, sent as they are: one prompt set for every engine
        served = loadgen.run(url, [list(i) for i in ids], num_requests=len(prompts), max_concurrency=max_concurrency,
                             max_tokens=max_tokens, endpoint="completions")
    rows.append({"engine": "vllm serve + labkit.serve.loadgen", **served.summary()})
    return [{k: v for k, v in r.items() if k != "texts"} for r in rows]


def models_path(lm: Any) -> str:
    """The local directory or hub id vLLM should load for a ``models.Loaded`` model."""
    name = getattr(lm, "name", None)
    return models.resolve(None if name in (None, models.display_name(None)) else name)


@contextlib.contextmanager
def serve_here(model_path: str, dtype: str = "float16", tensor_parallel_size: int = 1,
                startup_timeout_s: float = 600.0, extra_args: Sequence[str] = (),
                gpu_memory_utilization: float = VLLM_GPU_MEMORY_UTILIZATION) -> Iterator[str]:
    """``vllm serve MODEL --dtype float16 --gpu-memory-utilization F`` from this environment's vLLM (a GPU
    environment that imports vllm), through ``labkit.serve.vllm.server``; yields its URL once /health answers
    and stops its process group afterwards. Drive it with ``labkit.serve.loadgen.run(url, ...)``."""
    _check_fraction(gpu_memory_utilization)
    cap = env.capability("vllm-offline")
    if not cap.available:
        raise ValueError(f"vLLM cannot run here: {cap.reason}")
    settings = vs.Settings(model=model_path, dtype=dtype, device="cuda",
                                        tensor_parallel_size=tensor_parallel_size, extra_args=tuple(extra_args),
                                        gpu_memory_utilization=gpu_memory_utilization)
    with vs.serve(settings, python=Path(sys.executable), deadline_s=startup_timeout_s) as server:
        yield server.url


# ------------------------------------------------------------------------ vLLM's engine on the lab's workload

VLLM_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # labkit's names -> vLLM's --dtype


def hf_greedy(lm: Any, work: Sequence[Any]) -> dict[str, list[int]]:
    """transformers ``generate``, greedy, each request alone with its own answer limit: ids up to EOS."""
    import torch

    eos = decoder.eos_ids(lm.model, lm.tokenizer)
    out = {}
    with torch.inference_mode():
        for r in work:
            ids = torch.tensor([list(r.prompt_ids)], device=lm.device)
            gen = lm.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=r.max_new_tokens, pad_token_id=lm.tokenizer.pad_token_id)
            out[r.id] = until_eos(gen[0, ids.shape[1]:].tolist(), eos)
    return out


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
