"""A quantised KV cache: keys and values stored in fewer bits, measured at long context.

At long context the KV cache, not the weights, is what grows: 2 × layers × KV heads × head_dim values per
token. transformers' ``QuantizedCache`` (after KIVI) stores it in 2 or 4 bits through a backend (quanto
or HQQ), keeping the most recent ``residual_length`` tokens in full precision and re-quantising them
into the stored part when that buffer fills. Its attention still runs on dequantised keys and values:
the cache is smaller, each step does more work.

The lab's own version is the same cache layer with a quantiser written out: int8, one absmax scale per
channel (per head-dimension entry, over the tokens), as KIVI does for keys. ``compare`` prefills the same
long context into each cache, feeds the fp32 reference's greedy continuation one token at a time
(teacher forcing) and reports the bytes the cache holds, the step time and, against the model's own cache
(fp32 on a CPU, fp16 on a GPU), greedy agreement and KL.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import statistics
from collections.abc import Callable
from typing import Any

from ..core import env
from ..core.checks import positive
from ..core.timing import now
from ..decoding import decode
from ..decoding.decode import greedy, prefill
from ..decoding.quality import kl_divergence
from ..model.dtypes import torch_dtype
from ..model.prompts import eval_tokens
from .quantisers import dequantize_kv, quantize_kv

BACKENDS = {"quanto": ("optimum-quanto", "optimum.quanto"), "hqq": ("hqq", "hqq")}
INSTALL = {"quanto": "pip install 'labkit[kvquant]'", "hqq": "pip install hqq"}  # pure Python wheels both


def backend_reason(backend: str, device: Any = "cpu", dtype: str = "fp32") -> str:
    """'' when transformers' quantised cache can use ``backend`` on ``device`` (the model's: a backend that runs
    on the CPU may lack kernels on the GPU) with ``dtype`` activations; else one line saying why not."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown KV-cache quantisation backend {backend!r}; choose one of {sorted(BACKENDS)}")
    dist, module = BACKENDS[backend]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        return f"{dist} is not installed ({INSTALL[backend]})"
    try:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM, QuantizedCache

        cfg = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = LlamaForCausalLM(cfg).eval()
        model = model.to(device=device, dtype=torch_dtype(dtype))  # where, and in what, the real cache will run
        cache = QuantizedCache(backend=backend, config=cfg, nbits=4, q_group_size=16, residual_length=4)
        with torch.inference_mode():
            prefill(model, torch.arange(8, device=device).unsqueeze(0), cache=cache)  # (1, 8): fills the quantised part
            prefill(model, torch.arange(1, device=device).unsqueeze(0), cache=cache)  # (1, 1): reads it back
    except Exception as exc:  # noqa: BLE001  (narrowed below)
        if not env.backend_failure(exc):
            raise  # labkit's own bug (a TypeError, a broken invariant): surface it, never a capability gap
        # a backend that imports but cannot run here: say what it raised
        return f"{dist} {importlib.metadata.version(dist)} failed on a tiny model: {type(exc).__name__}: {exc}"[:300]
    return ""


def _quantized_layer_class():
    from transformers.cache_utils import QuantizedLayer

    class LabQuantizedLayer(QuantizedLayer):
        """transformers' quantised cache layer (full-precision recent tokens, re-quantised in bulk) with the
        quantiser passed in: ``quantize(x) -> stored``, ``dequantize(stored) -> x``."""

        def __init__(self, quantize: Callable[[Any], Any], dequantize: Callable[[Any], Any], residual_length: int) -> None:
            super().__init__(nbits=8, residual_length=residual_length)
            self._q, self._dq = quantize, dequantize

        def _quantize(self, tensor: Any, axis: int) -> Any:
            return self._q(tensor)

        def _dequantize(self, q_tensor: Any) -> Any:
            return self._dq(q_tensor)

    return LabQuantizedLayer


def lab_cache(config: Any, quantize: Callable[[Any], Any] | None = None, dequantize: Callable[[Any], Any] | None = None,
              residual_length: int = 128) -> Any:
    """A transformers ``Cache`` whose layers store keys and values with ``quantize``/``dequantize``
    (default: ``quantize_kv``/``dequantize_kv``, int8 per channel)."""
    from transformers.cache_utils import Cache

    q = quantize or quantize_kv
    dq = dequantize or (lambda stored: dequantize_kv(*stored))
    layer = _quantized_layer_class()
    n = config.get_text_config().num_hidden_layers
    return Cache(layers=[layer(q, dq, residual_length) for _ in range(n)])


def fp16_storage_cache(config: Any, residual_length: int = 128) -> Any:
    """Keys and values stored in fp16, handed back in the dtype they came in: half the bytes of an fp32 cache."""
    import torch

    return lab_cache(config, lambda x: (x.to(torch.float16), x.dtype), lambda s: s[0].to(s[1]), residual_length)


def library_cache(config: Any, backend: str, nbits: int = 4, q_group_size: int = 64, residual_length: int = 128) -> Any:
    """transformers' ``QuantizedCache`` (``backend`` 'quanto' or 'hqq')."""
    from transformers import QuantizedCache

    return QuantizedCache(backend=backend, config=config, nbits=nbits, q_group_size=q_group_size,
                          residual_length=residual_length)


# ------------------------------------------------------------------------------------ measuring it


def storage_bytes(obj: Any) -> int:
    """Bytes of every tensor ``obj`` holds: plain tensors, tensor subclasses (quanto's packed tensors, through
    ``__tensor_flatten__``), and tensors inside tuples, lists and dicts (HQQ's scales and zeros)."""
    import torch

    if isinstance(obj, torch.Tensor):
        if type(obj) is not torch.Tensor and hasattr(obj, "__tensor_flatten__"):
            names, _ = obj.__tensor_flatten__()
            return sum(storage_bytes(getattr(obj, n)) for n in names)
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(storage_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(storage_bytes(v) for v in obj)
    return 0


def cache_storage_bytes(cache: Any) -> int:
    """Bytes a transformers cache holds: full-precision keys/values plus the quantised parts, scales included."""
    total = 0
    for layer in cache.layers:
        for name in ("keys", "values", "_quantized_keys", "_quantized_values"):
            total += storage_bytes(getattr(layer, name, None))
    return total


def context_ids(tokenizer: Any, n_tokens: int, device: Any) -> Any:
    """(1, n_tokens) ids of the evaluation text: a long context that is real prose."""
    import torch

    positive("n_tokens", n_tokens)
    ids = eval_tokens(tokenizer)
    if n_tokens > len(ids):
        raise ValueError(f"the evaluation text has {len(ids)} tokens; asked for {n_tokens}")
    return torch.tensor([ids[:n_tokens]], device=device)


def teacher_forced(model: Any, context: Any, continuation: list[int], cache: Any) -> dict[str, Any]:
    """Prefill ``context`` into ``cache``, then feed ``continuation`` one token per step: the (n, V) fp32
    logits that predict each continuation token (the first from the prefill) and each step's seconds."""
    import torch

    device = context.device
    rows, step_s = [], []
    with torch.inference_mode():
        t0 = now(device)
        logits, cache = prefill(model, context, cache=cache)
        prefill_s = now(device) - t0
        rows.append(logits[0].float())
        for i, tok in enumerate(continuation[:-1]):
            position = torch.tensor([context.shape[1] + i], device=device)
            t0 = now(device)
            logits = decode.decode_one_token(model, torch.tensor([tok], device=device), cache, position)
            step_s.append(now(device) - t0)
            rows.append(logits[0].float())
    return {"logits": torch.stack(rows).cpu(), "prefill_s": prefill_s, "step_s": step_s, "cache": cache}


def compare(model: Any, context: Any, new_tokens: int, caches: dict[str, Callable[[], Any]]) -> list[dict[str, Any]]:
    """The greedy continuation of ``context`` with the model's own ``DynamicCache`` is the reference; each cache in ``caches``
    (name → factory) is prefilled with the same context and teacher-forced on it. One row per cache: status, KV
    bytes held, median decode step (every step's time in ``samples``), agreement and mean KL against the reference.
    A cache whose backend fails here (no kernel on this device, say) becomes a row whose status says why, and the
    others still run."""
    import torch
    from transformers import DynamicCache

    positive("new_tokens", new_tokens)
    continuation = greedy(model, context, new_tokens=new_tokens)[0].tolist()
    ref = teacher_forced(model, context, continuation, DynamicCache())
    ref_lp = torch.log_softmax(ref["logits"], dim=-1)
    target = torch.tensor(continuation, device="cpu")  # beside the logits teacher_forced read back
    rows = []
    base = f"{str(model.dtype).replace('torch.', '')} (DynamicCache)"  # the model's own cache: the reference
    for name, make in {base: DynamicCache, **caches}.items():
        try:
            run = ref if name == base else teacher_forced(model, context, continuation, make())
        except Exception as exc:  # noqa: BLE001  (narrowed below)
            if not env.backend_failure(exc):
                raise  # labkit's own bug: surface it
            rows.append({"cache": name, "status": f"failed here: {type(exc).__name__}: {str(exc)[:200]}",
                         "context_tokens": int(context.shape[1]), "new_tokens": new_tokens, "kv_bytes": None,
                         "prefill_s": None, "step_s": None, "decode_tokens_per_s": None, "agreement": None,
                         "kl": None, "kl_max": None})
            continue
        kl = kl_divergence(ref_lp, run["logits"])
        step = statistics.median(run["step_s"]) if run["step_s"] else None
        rows.append({"cache": name, "status": "ok", "context_tokens": int(context.shape[1]), "new_tokens": new_tokens,
                     "kv_bytes": cache_storage_bytes(run["cache"]), "prefill_s": run["prefill_s"],
                     "step_s": step, "decode_tokens_per_s": 1 / step if step else None,
                     "agreement": float((run["logits"].argmax(-1) == target).float().mean()),
                     "kl": float(kl.mean()), "kl_max": float(kl.max()), "samples": {"step_s": list(run["step_s"])}})
    base = rows[0]["kv_bytes"]
    for r in rows:
        r["bytes_ratio"] = base / r["kv_bytes"] if r["kv_bytes"] else None
    return rows
