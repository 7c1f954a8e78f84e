"""Live panels for the notebooks. Each callback is a plain function, tested without a browser."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from . import config, sizing

CONFIGS_DIR = config.DATA_DIR / "configs"


def model_choices() -> dict[str, str]:
    """Public model configs shipped in data/configs: label → directory."""
    return {p.name: str(p) for p in sorted(CONFIGS_DIR.iterdir()) if (p / "config.json").is_file()}


def sizing_answer(model: str, dtype: str, context: int, batch: int, gpu: str) -> dict[str, Any]:
    """Does it fit, and how fast can it decode at most? One dict for the panel to show."""
    est = sizing.estimate(model, dtype=dtype, context=context, batch=batch, gpu=gpu)
    assert est.fits is not None and est.decode_tokens_per_s_ceiling is not None
    return {
        "model": Path(model).name, "gpu": est.gpu, "dtype": est.dtype,
        "weights_gib": est.weight_bytes / 2**30, "kv_gib": est.kv_bytes / 2**30,
        "total_gib": est.total_bytes / 2**30, "gpu_gib": est.gpu_memory_bytes / 2**30,
        "fits": est.fits,
        "ceiling_tokens_per_s": est.decode_tokens_per_s_ceiling,
        "ceiling_per_sequence": est.decode_tokens_per_s_per_sequence_ceiling,
        "compute_bound_batch": est.compute_bound_batch,
    }


def sizing_html(ans: dict[str, Any]) -> str:
    verdict = ("<b style='color:#1a7f37'>fits</b>" if ans["fits"]
               else "<b style='color:#cf222e'>does not fit</b>")
    cb = ans["compute_bound_batch"]
    cb_text = f"{cb:,.0f}" if cb is not None else "never at this context (KV reads grow faster than compute)"
    return (f"<p>{ans['model']} in {ans['dtype']} on {ans['gpu']}: {verdict} — "
            f"weights {ans['weights_gib']:.2f} GiB + KV {ans['kv_gib']:.2f} GiB = {ans['total_gib']:.2f} GiB "
            f"of {ans['gpu_gib']:.0f} GiB.</p>"
            f"<p>Decode ceiling: <b>{ans['ceiling_tokens_per_s']:,.0f} tokens/s</b> in total, "
            f"{ans['ceiling_per_sequence']:,.0f} per sequence. Compute-bound above batch: {cb_text}.</p>")


def sizing_panel(default_model: str | None = None):
    """Sliders for model, precision, context, batch and GPU; the answer updates live."""
    import ipywidgets as w

    from . import hardware

    models = model_choices()
    model = w.Dropdown(options=list(models.items()), value=models.get(default_model or "Llama-3.1-8B",
                       next(iter(models.values()))), description="model")
    dtype = w.Dropdown(options=list(sizing.DTYPE_BYTES), value="fp16", description="precision")
    context = w.IntSlider(value=4096, min=256, max=131072, step=256, description="context")
    batch = w.IntSlider(value=1, min=1, max=256, description="batch")
    gpu = w.Dropdown(options=[g.name for g in hardware.catalog()], value="L4", description="GPU")
    out = w.HTML()

    def update(_change: Any = None) -> None:
        out.value = sizing_html(sizing_answer(model.value, dtype.value, context.value, batch.value, gpu.value))

    for control in (model, dtype, context, batch, gpu):
        control.observe(update, names="value")
    update()
    return w.VBox([w.HBox([model, dtype, gpu]), w.HBox([context, batch]), out])
