"""labkit.precision.calibration: one layer's int8 scales (dynamic, per-token, static absmax and percentile)
scored per held-out prompt against the layer's own input and output."""
from __future__ import annotations

import pytest

from labkit.model import models
from labkit.precision import calibration, quantisers


def test_calibration_scores_outputs_per_prompt(tiny_llama):
    import torch

    model, tok = tiny_llama
    held_out = ["Name a colour.", "Write a long sentence about the sea and the wind and the ships."]
    cal = calibration.calibrate_layer(model, tok, ["Hello there", "Explain the water cycle."], held_out,
                                  layer="model.layers.0.mlp.down_proj", percentile=99.0)
    assert cal.calibration_values > 0 and 0 < cal.percentile_value < cal.absmax
    rows = cal.frame()
    assert len(rows) == 4 * len(held_out) and set(rows.prompt) == set(held_out)
    # the layer's input, captured independently, for each held-out prompt
    seen = {}
    layer = model.model.layers[0].mlp.down_proj
    hook = layer.register_forward_hook(lambda m, args, out: seen.update(x=args[0].detach(), y=out.detach()))
    try:
        for p in held_out:
            with torch.inference_mode():
                model(**models.chat_inputs(tok, p))
            x, y = seen["x"], seen["y"]
            by = rows[rows.prompt == p].set_index("method")
            dyn = by.loc["dynamic, per-prompt scale"]
            assert dyn.scale == pytest.approx(float(x.abs().max()) / 127)  # this prompt's own scale
            assert dyn.clipped_fraction == 0
            assert dyn.max_at_token == int(x.abs().amax(-1).flatten().argmax())  # the token holding the largest |x|
            tok_scale = by.loc["dynamic, per-token scale"]
            assert tok_scale.scale == pytest.approx(float(x.abs().amax(-1).mean()) / 127, rel=1e-5)
            assert tok_scale.clipped_fraction == 0 and tok_scale.layer_error <= dyn.layer_error
            static = by.loc["static, absmax scale"]
            assert static.scale == pytest.approx(cal.absmax / 127)
            with torch.inference_mode():  # the score is the layer's output error, not the activations'
                want = float((layer(quantisers.fake_int8(x, static.scale)) - y).norm() / y.norm())
            assert static.layer_error == pytest.approx(want, rel=1e-4)
            assert (by.kl >= 0).all() and by.kl.max() > 0
    finally:
        hook.remove()
    summary = cal.summary()
    assert set(summary) == set(rows.method) and all(v["prompts"] == len(held_out) for v in summary.values())
    clipped = rows[rows.method == "static, p99 scale"].clipped_fraction
    assert (clipped > 0).any()  # the percentile scale clips the largest held-out values
    with pytest.raises(ValueError, match="no layer"):
        calibration.calibrate_layer(model, tok, ["a"], ["b"], layer="model.nope")
    with pytest.raises(ValueError, match="percentile"):
        calibration.calibrate_layer(model, tok, ["a"], ["b"], percentile=100)
