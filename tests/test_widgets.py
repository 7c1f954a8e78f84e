from labkit import config, widgets

CONFIGS = config.DATA_DIR / "configs"


def test_model_choices_lists_shipped_configs():
    choices = widgets.model_choices()
    assert "Llama-3.1-8B" in choices and "SmolLM2-135M-Instruct" in choices


def test_sizing_answer_fit_and_ceiling():
    small = widgets.sizing_answer(str(CONFIGS / "Llama-3.1-8B"), "fp16", 4096, 1, "H100-SXM")
    assert small["fits"] is True and small["ceiling_tokens_per_s"] > 100
    big = widgets.sizing_answer(str(CONFIGS / "Llama-3.1-8B"), "fp16", 4096, 1, "T4")
    assert big["fits"] is False
    # quantising to nf4 makes it fit on the T4 and raises the ceiling
    q = widgets.sizing_answer(str(CONFIGS / "Llama-3.1-8B"), "nf4", 4096, 1, "T4")
    assert q["fits"] is True and q["ceiling_tokens_per_s"] > big["ceiling_tokens_per_s"]
    html = widgets.sizing_html(big)
    assert "does not fit" in html


def test_panel_builds_and_updates():
    panel = widgets.sizing_panel()
    out = panel.children[-1]
    before = out.value
    batch = panel.children[1].children[1]
    batch.value = 64
    assert out.value != before
