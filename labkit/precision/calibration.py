"""Static int8 scales from calibration prompts: capture one layer's inputs, choose a scale (absmax or a
percentile), and score it on held-out prompts against each prompt's own dynamic scale.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.checks import model_device
from ..decoding import quality
from ..model.models import chat_inputs
from .quantisers import fake_int8

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

    if not calibration or not held_out:
        raise ValueError("pass at least one calibration prompt and one held-out prompt")
    if not 0 < percentile < 100:
        raise ValueError(f"percentile={percentile}: must lie strictly between 0 and 100")
    modules = dict(model.named_modules())
    if layer not in modules:
        linear = [n for n, m in modules.items() if isinstance(m, torch.nn.Linear)][:3]
        raise ValueError(f"no layer {layer!r} in the model; for example {linear}")
    target = modules[layer]
    device = model_device(model)
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
