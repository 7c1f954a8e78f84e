"""One loader for every precision variant: PyTorch, bitsandbytes, ONNX Runtime and rounded weights, by name.

    fp32              PyTorch float32: the reference every other row is compared with
    fp16, bf16        PyTorch half precision (weights and compute)
    bnb-int8          bitsandbytes LLM.int8: int8 weights, one scale per row, fp16 outlier columns
    bnb-nf4           bitsandbytes 4-bit NormalFloat, one absmax per 64 weights (double quant optional)
    ort-fp32          exported to ONNX by transformers' exporter, run by ONNX Runtime
    ort-int8-tensor   ONNX Runtime dynamic int8, one scale per weight tensor
    ort-int8-channel  ONNX Runtime dynamic int8, one scale per output channel
    fp8-tensor, fp8-channel, int8-channel, nvfp4, mxfp4, int4-g64: the linear weights rounded to that format
                      (labkit.precision.formats), held in fp32: its answer quality where no kernel runs it; no timing

Each variant is one ``Spec`` in ``SPECS`` (description, sizing dtype, loader, capabilities, devices, options);
the name tables are derived from it, so adding a variant is one entry plus its loader.

``load_variant(name)`` never crashes for a variant this machine cannot run: it returns a
``Variant`` whose ``status`` says why. Exported and quantised ONNX files are cached under
``labkit.core.config.cache_dir() / "onnx"`` and reused; each is written to a temporary folder
beside its target and renamed into place, so an interrupted export never leaves half a model.
Each variant's speed, memory and quality are measured by ``measure``.
"""
from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any

from ..core import env, memory, timing
from ..model import dtypes, models, onnx, sizing
from ..model.hardware import int8_saturation_risk
from ..model.onnx import INT8_ON_GPU_NOTE, onnx_bytes, onnx_files, ort_provider
from . import formats, libraries


@dataclass(frozen=True)
class Spec:
    """Everything labkit knows about one precision variant; every table below is derived from ``SPECS``. Adding a
    variant is one entry here plus its loader (``_load_*``, taking the ``Variant`` and the model name)."""

    name: str
    description: str
    sizing_dtype: str  # labkit.model.dtypes name of the stored weights (its LAYOUTS entry when quantised)
    loader: str  # the name of this module's function that loads it
    capabilities: tuple[str, ...] = ()  # env.capability names that must be available
    devices: tuple[str, ...] = ("cpu", "cuda", "mps")  # device kinds it has kernels for
    options: dict[str, str] = field(default_factory=dict)  # the options it accepts, each with its meaning
    all_weights_quantised: bool = False  # ONNX Runtime's dynamic int8: embeddings too, tied lm_head copied
    cpu_provider_only: bool = False  # its operators have no CUDA kernels: on a GPU it runs on the CPU, labelled
    fake_format: str | None = None  # a labkit.precision.formats name: weights rounded to it, computed in fp32


_ORT = ("onnxruntime", "onnx-export")
_PROVIDER = {"provider": "ONNX Runtime execution provider (default: CUDA when in use, else CPU)"}
_REDUCE_RANGE = {"reduce_range": "quantise weights to 7 bits; default: True on x86 CPUs without VNNI "
                                 "(see int8_saturation_risk), else False as in ONNX Runtime"}
SPECS: dict[str, Spec] = {s.name: s for s in (
    Spec("fp32", "PyTorch float32 (the reference)", "fp32", "_load_torch"),
    Spec("fp16", "PyTorch float16 weights and compute", "fp16", "_load_torch"),
    Spec("bf16", "PyTorch bfloat16 weights and compute", "bf16", "_load_torch"),
    Spec("bnb-int8", "bitsandbytes LLM.int8 (int8 weights, fp16 outlier columns)", "int8", "_load_bnb",
         ("bitsandbytes",), ("cpu", "cuda"), {"threshold": "outlier threshold of LLM.int8 (default 6.0)"}),
    Spec("bnb-nf4", "bitsandbytes 4-bit NF4, block size 64", "nf4", "_load_bnb", ("bitsandbytes",), ("cpu", "cuda"),
         {"double_quant": "also quantise the absmax scales (default False)",
          "compute_dtype": "dtype the 4-bit weights are dequantised to: fp32, fp16 or bf16 "
                           "(default fp32 on CPU, fp16 on CUDA)"}),
    Spec("ort-fp32", "ONNX Runtime float32 (transformers' ONNX export)", "fp32", "_load_ort", _ORT, ("cpu", "cuda"),
         _PROVIDER),
    Spec("ort-int8-tensor", "ONNX Runtime dynamic int8, per-tensor scales", "int8", "_load_ort", _ORT,
         ("cpu", "cuda"), {**_PROVIDER, **_REDUCE_RANGE}, all_weights_quantised=True,
         cpu_provider_only=True),
    Spec("ort-int8-channel", "ONNX Runtime dynamic int8, per-channel scales", "int8", "_load_ort", _ORT,
         ("cpu", "cuda"), {**_PROVIDER, **_REDUCE_RANGE}, all_weights_quantised=True,
         cpu_provider_only=True),
    *(Spec(name, f"{formats.FORMATS[fmt].description} (rounded, computed in fp32)", dtype, "_load_fake",
           fake_format=fmt)
      for name, fmt, dtype in (("fp8-tensor", "fp8-e4m3-tensor", "fp8"), ("fp8-channel", "fp8-e4m3-channel", "fp8"),
                               ("int8-channel", "int8-channel", "int8"),
                               ("nvfp4", "nvfp4", "nvfp4"), ("mxfp4", "mxfp4", "mxfp4"),
                               ("int4-g64", "int4-g64", "int4"))),
)}
# derived views, for readers that want one column
VARIANTS: dict[str, str] = {n: s.description for n, s in SPECS.items()}
NAMES: tuple[str, ...] = tuple(SPECS)
SIZING_DTYPE: dict[str, str] = {n: s.sizing_dtype for n, s in SPECS.items()}  # dtypes.DTYPE_BYTES key
OPTIONS: dict[str, dict[str, str]] = {n: s.options for n, s in SPECS.items() if s.options}


def names() -> list[str]:
    """The variant names ``load_variant`` accepts, reference first."""
    return list(NAMES)


def check_name(name: str) -> str:
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {name!r}; choose one of {list(NAMES)}")
    return name


# ---------------------------------------------------------------- the variant object


@dataclass
class Variant:
    """A loaded model variant, or the reason it cannot run here (``status``)."""

    name: str
    status: str = "ok"
    model: Any = None
    tokenizer: Any = None
    backend: str = ""  # torch | bitsandbytes | onnxruntime
    device: str = "cpu"
    load_s: float | None = None
    weight_bytes: int | None = None
    weight_bytes_source: str = ""
    predicted_weight_bytes: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    prepare_s: float | None = None  # seconds spent exporting/quantising now (None: reused from the cache)
    rss_before_bytes: int | None = None
    load_peak_rss_bytes: int | None = None  # highest RSS during the load (an export or quantisation included)
    load_peak_cuda_bytes: int | None = None
    cuda_resident_bytes: int | None = None  # CUDA allocator bytes already in use when the load began (other models)
    rss_sampler: Any = field(default=None, repr=False)  # memory.RSSSampler from the load to the end of the timed runs
    providers: list[str] = field(default_factory=list)  # ONNX Runtime: the providers the session really got
    note: str = ""  # where and why a variant runs somewhere other than the device asked for
    weight_error: float | None = None  # rounded weights: ‖w − q(w)‖ / ‖w‖ over every rounded layer together
    layer_errors: list[dict[str, Any]] = field(default_factory=list)  # rounded weights: one row per layer

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def description(self) -> str:
        return SPECS[self.name].description

    def release(self) -> None:
        """Drop the model and hand its memory back, so the next variant's memory reading is its own."""
        self.model = None
        if self.rss_sampler is not None:
            self.rss_sampler.stop()
        gc.collect()
        if importlib.util.find_spec("torch") is not None:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc keeps freed heap otherwise; RSS would not drop

    def summary(self) -> dict[str, Any]:
        return {"variant": self.name, "status": self.status, "backend": self.backend, "device": self.device,
                "load_s": self.load_s, "weight_bytes": self.weight_bytes,
                "weight_bytes_source": self.weight_bytes_source,
                "predicted_weight_bytes": self.predicted_weight_bytes, "prepare_s": self.prepare_s,
                "options": dict(self.options), "providers": list(self.providers), "note": self.note,
                "cuda_resident_bytes": self.cuda_resident_bytes, "weight_error": self.weight_error,
                "layer_errors": list(self.layer_errors)}


def _validate_options(name: str, options: dict[str, Any]) -> None:
    allowed = OPTIONS.get(name, {})
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise ValueError(f"variant {name!r} takes no option(s) {unknown}; valid: {sorted(allowed) or 'none'}")


def predicted_weight_bytes(name: str, model_name: str | None = None) -> int:
    """labkit.model.sizing's prediction. ONNX Runtime's dynamic quantisation stores every weight as int8,
    embeddings too, and a tied output embedding becomes its own (transposed) int8 copy, so its
    prediction is (parameters + tied lm_head) × 1 byte rather than sizing's LLM.int8 layout."""
    check_name(name)
    model = _sizing_model(model_name)
    s = sizing.shape(model)
    if SPECS[name].all_weights_quantised:
        tied = bool(getattr(sizing.load_config(model), "tie_word_embeddings", False))
        return int((s.n_params + (s.vocab_size * s.hidden_size if tied else 0)) * dtypes.DTYPE_BYTES["int8"])
    return sizing.weight_bytes(s, SIZING_DTYPE[name])


def _sizing_model(model_name: str | None) -> str:
    return model_name or os.environ.get("LABKIT_MODEL") or "default"


def load_variant(name: str, model_name: str | None = None, device: str | None = None, **options: Any) -> Variant:
    """Load ``name`` (see ``names()``) of the default model (or ``model_name`` / ``LABKIT_MODEL``).

    Returns a ``Variant``; when this machine cannot run it, ``status`` holds the reason and
    ``model`` is None. Unknown names or options raise ``ValueError`` listing the valid ones.
    """
    check_name(name)
    _validate_options(name, options)
    device = device or env.device()
    v = Variant(name=name, device=device, options=dict(options))
    v.predicted_weight_bytes = predicted_weight_bytes(name, model_name)
    reason = _unavailable_reason(name, device)
    if reason:
        v.status = reason
        return v
    if options.get("provider") is not None:
        ort_provider(device, options["provider"])  # a provider this machine lacks is the caller's mistake
        if SPECS[name].cpu_provider_only and options["provider"] != "CPUExecutionProvider":
            raise ValueError(f"{name} runs on provider 'CPUExecutionProvider' only: {INT8_ON_GPU_NOTE}")
    loader = globals()[SPECS[name].loader]
    v.rss_sampler = memory.RSSSampler().start()  # read in measure_variant: the peak over load and timed runs
    with memory.track(device) as mem, timing.track(device) as t:
        try:
            loader(v, model_name)
        except models.ModelNotFound:
            raise  # a wrong model name is the caller's to fix, not a property of this machine
        except Exception as exc:
            if not env.backend_failure(exc):
                raise  # labkit's own bug: surface it, never report it as a capability gap
            v.status = f"cannot run here: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            v.model = None
            v.rss_sampler.stop()
            return v
    v.load_s = t.seconds - (v.prepare_s or 0.0)
    v.rss_before_bytes = mem.rss_before.bytes
    v.rss_sampler.stop()  # the load's peak (a one-time export or quantisation included), kept apart from the runs'
    v.load_peak_rss_bytes = v.rss_sampler.peak_bytes
    v.rss_sampler = memory.RSSSampler().start()
    v.load_peak_cuda_bytes = mem.cuda_peak.bytes
    v.cuda_resident_bytes = mem.cuda_before.bytes
    return v


def _unavailable_reason(name: str, device: str) -> str:
    spec = SPECS[name]
    if name == "bf16" and device.startswith("cuda"):
        cap = env.bf16(device)
        return "" if cap.available else cap.reason
    for cap_name in spec.capabilities:
        cap = env.capability(cap_name)
        if not cap.available:
            return cap.reason
    kind = device.split(":")[0]
    if kind not in spec.devices:
        if kind == "mps":
            return f"{name} has no Apple-GPU kernels here; use device='cpu'"
        return f"{name} has no kernels for {kind!r} here; it runs on {', '.join(spec.devices)}"
    return ""


def _load_torch(v: Variant, model_name: str | None) -> None:
    lm = models.load(model_name, dtype=v.name, device=v.device)
    v.model, v.tokenizer, v.backend = lm.model, lm.tokenizer, "torch"
    v.weight_bytes = memory.tensor_bytes(list(lm.model.parameters()) + list(lm.model.buffers()))
    v.weight_bytes_source = "parameter + buffer bytes"


def _load_bnb(v: Variant, model_name: str | None) -> None:
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    cuda = v.device.startswith("cuda")
    if v.name == "bnb-int8":
        qcfg = BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=float(v.options.get("threshold", 6.0)))
    else:
        compute = v.options.get("compute_dtype", "fp16" if cuda else "fp32")
        qcfg = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                  bnb_4bit_use_double_quant=bool(v.options.get("double_quant", False)),
                                  bnb_4bit_compute_dtype=dtypes.torch_dtype(compute))
        v.options.setdefault("compute_dtype", compute)
    tok = models.load_tokenizer(model_name)
    # the layers bitsandbytes leaves alone (embeddings, norms, lm_head) are stored in fp16
    model = AutoModelForCausalLM.from_pretrained(models.resolve(model_name), quantization_config=qcfg,
                                                 dtype=torch.float16, device_map=v.device)
    model.eval()
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    v.model, v.tokenizer, v.backend = model, tok, "bitsandbytes"
    v.weight_bytes = memory.tensor_bytes(list(model.parameters()) + list(model.buffers()) + libraries.bnb_state_tensors(model))
    v.weight_bytes_source = "parameter + buffer bytes + quantisation scales (absmax / SCB)"


def _load_fake(v: Variant, model_name: str | None) -> None:
    """fp32 weights, every decoder Linear rounded to the spec's format (``formats.round_model``): quality, no timing."""
    lm = models.load(model_name, dtype="fp32", device=v.device)
    r = formats.round_model(lm.model, SPECS[v.name].fake_format)
    v.model, v.tokenizer, v.backend, v.note = lm.model, lm.tokenizer, "torch", formats.ROUNDED_NOTE
    v.weight_bytes, v.weight_bytes_source = r["stored_bytes"], r["stored_bytes_source"]
    v.weight_error, v.layer_errors = r["weight_error"], r["layers"]


def _load_ort(v: Variant, model_name: str | None) -> None:
    if v.name == "ort-fp32":
        folder, prep = onnx.export_onnx(model_name)
    else:
        rr = v.options.get("reduce_range")
        rr = int8_saturation_risk() if rr is None else bool(rr)
        v.options["reduce_range"] = rr
        folder, prep = onnx.quantize_onnx(per_channel=v.name.endswith("channel"), reduce_range=rr, model_name=model_name)
    v.prepare_s = prep
    if SPECS[v.name].cpu_provider_only and v.device.startswith("cuda"):
        v.device = "cpu"  # labelled: the row says it ran on the CPU, and why
        v.note = INT8_ON_GPU_NOTE
    provider = ort_provider(v.device, v.options.get("provider"))
    v.options["provider"] = provider
    tok = models.load_tokenizer(model_name)
    model, v.providers = onnx.ort_model(folder, tok, provider, device=v.device)
    v.model, v.tokenizer, v.backend = model, tok, "onnxruntime"
    v.device = "cpu" if v.providers[0] == "CPUExecutionProvider" else str(model.device)
    v.files = [str(p) for p in onnx_files(folder)]
    v.weight_bytes = onnx_bytes(folder)
    v.weight_bytes_source = "size of the .onnx file(s) and external data"
