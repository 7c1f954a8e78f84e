"""Jargon is defined where it is first used: docs/glossary.md, and a link to it at each term's first use.

The notebooks are read in order (00 → 11), markdown and code cells alike (import lines left out: a module's
name is not a use of the term). A term's first use must be in the cell that links its glossary entry
(``../docs/glossary.md#anchor``), or after it; every glossary link must point at an anchor that exists.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tools import cells as percent

ROOT = Path(__file__).resolve().parent.parent
GLOSSARY = ROOT / "docs" / "glossary.md"
SOURCES = sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]*_*.py"))
LINK = re.compile(r"\.\./docs/glossary\.md#([A-Za-z0-9_-]+)")
ANCHOR = re.compile(r'<a id="([A-Za-z0-9_-]+)"></a>')
IMPORT = re.compile(r"^\s*(import|from)\s+\S+")

# glossary anchor → what counts as a use of the term in a notebook (one regular expression)
TERMS: dict[str, str] = {
    "ttft": r"\bTTFT\b|ttft_",
    "tpot": r"\bTPOT\b|tpot_",
    "itl": r"\bITL\b|(?<![a-z])itl_|inter-token latency",
    "e2e": r"\bE2E\b|(?<![a-z])e2e_",
    "tokens-per-second": r"tokens/s\b|tok/s",
    "prefill": r"(?i)\bprefill",
    "decode": r"(?i)\bdecod(e|es|ing)\b",
    "greedy": r"(?i)\bgreedy\b",
    "kv-cache": r"\bKV\b|past_key_values",
    "quick-mode": r"(?i)quick mode|LABKIT_QUICK",
    "fp32": r"\bfp32\b|float32",
    "fp16": r"\bfp16\b|\bfloat16\b",
    "bf16": r"\bbf16\b|bfloat16",
    "int8": r"(?i)\bint8\b",
    "nf4": r"(?i)\bnf4\b",
    "meta-device": r"(?i)meta device|meta-device",
    "memory-sources": r"(?i)\brss\b|resident set|\bNVML\b|cuda_peak",
    "rss-peak": r"rss_peak|peak_rss",
    "roofline": r"(?i)roofline|\bridge\b",
    "flops": r"FLOP",
    "matmul": r"(?i)\bmatmul|\bGEMV\b|\bGEMM\b|gemv|matrix-vector",
    "arithmetic-intensity": r"(?i)arithmetic intensity",
    "memory-bound": r"(?i)memory-bound|compute-bound",
    "decode-ceiling": r"(?i)decode ceiling|\bceiling",
    "gqa": r"\bGQA\b|(?i:grouped-query)",
    "rmsnorm": r"RMSNorm|rms_norm",
    "lm-head": r"lm_head|output head",
    "logits": r"(?i)\blogits?\b",
    "spread": r"\bspread\b|\bp10\b|(?<![A-Za-z0-9])p(50|90|99)(?![0-9])",
    "interleaved-rounds": r"(?i)interleaved rounds|\bdrift",
    "a-a-test": r"\bA/A\b",
    "paired-test": r"(?i)\bpaired test|sign-flip",
    "magnitude-floor": r"(?i)magnitude floor",
    "power": r"(?i)\bstatistical power\b|power formula|\b90 % power\b",
    "batch-invariance": r"(?i)batch[- ]invarian",
    "bootstrap-interval": r"(?i)\bbootstrap\b",
    "perplexity": r"(?i)perplexit",
    "greedy-agreement": r"(?i)\bagreement\b",
    "kl-divergence": r"\bKL\b",
    "teacher-forcing": r"(?i)teacher-forc",
    "quantisation": r"(?i)quantis|quantiz",
    "absmax": r"(?i)absmax",
    "per-tensor-per-channel": r"(?i)per[- ]tensor|per[- ]channel",
    "llm-int8": r"LLM\.int8",
    "dynamic-quantisation": r"(?i)dynamic int8|dynamic quantis|quantize_dynamic",
    "qdq": r"\bQDQ\b",
    "calibration": r"(?i)calibrat",
    "onnx-runtime": r"\bONNX\b",
    "execution-provider": r"ExecutionProvider|(?i:execution provider|\bproviders?\b)",
    "cpu-instruction-sets": r"\bAVX|VNNI|\bvnni|\bAMX\b|\bavx2\b",
    "kernel": r"(?i)\bkernels?\b",
    "eager": r"(?i)\beager\b",
    "torch-compile": r"torch\.compile",
    "dynamo": r"(?i)dynamo",
    "inductor": r"(?i)\binductor\b",
    "static-cache": r"(?i)static cache|static KV cache|static-cache|StaticCache",
    "cuda-graphs": r"CUDA graph",
    "sdpa": r"(?i)\bsdpa\b|scaled_dot_product_attention",
    "flashattention": r"FlashAttention|flash_attention|flash-attn",
    "left-padding": r"(?i)left[- ]pad",
    "static-batching": r"(?i)static batch|static sweep",
    "dynamic-batching": r"(?i)dynamic batching",
    "continuous-batching": r"(?i)continuous batching|continuous-batching",
    "pareto-front": r"(?i)pareto",
    "slo": r"\bSLO\b",
    "goodput": r"(?i)goodput",
    "open-loop": r"(?i)open[- ]loop|closed[- ]loop",
    "poisson-arrivals": r"(?i)poisson|burstiness|bursty",
    "vllm": r"\bvLLM\b",
    "paged-attention": r"(?i)pagedattention|paged attention|paged KV|paged allocation",
    "preemption": r"(?i)preempt",
    "tensor-parallelism": r"(?i)tensor[- ]parallel",
    "tensorrt": r"\bTensorRT\b",
    "speculative-decoding": r"(?i)speculative decoding|speculation",
    "prompt-lookup": r"(?i)prompt lookup|prompt-lookup",
    "prefix-caching": r"(?i)prefix cach|prefix cache",
    "chunked-prefill": r"(?i)chunked prefill|chunked-prefill",
    "kivi": r"KIVI|QuantizedCache|(?i:quantised KV)",
    "gguf": r"GGUF|\bgguf\b|Q4_1|Q8_0",
    "knee": r"(?i)\bknee\b",
    "routing-policies": r"(?i)routing polic|cache-aware|cache_aware|consistent hashing|round_robin",
    "rapl": r"\bRAPL\b",
    "structured-outputs": r"(?i)structured outputs?\b|token mask",
    "lora": r"\bLoRA\b",
    "disaggregated-serving": r"(?i)disaggregat",
    "fp8": r"\bFP8\b|\bfp8\b|E4M3|e4m3",
    "nvfp4": r"NVFP4|nvfp4",
    "mxfp4": r"MXFP4|mxfp4",
    "e8m0": r"E8M0|e8m0",
    "token-mask": r"(?i)token mask",
    "kv-connector": r"(?i)KV connector|ExampleConnector",
    "cache-buster": r"(?i)cache[- ]buster",
    "kv-tier": r"(?i)\bKV tiers?\b|disk tier",
    "mixture-of-experts": r"(?i)mixture of experts|\bMoE\b",
    "latent-attention": r"(?i)latent attention|kv_lora_rank",
    "sliding-window": r"(?i)sliding[- ]window",
}


def _parse(path: Path) -> list[str]:
    return [c.source for c in percent.parse(path.read_text(encoding="utf-8"))]


def _cells() -> list[tuple[str, int, list[str]]]:
    """(notebook, cell index, lines) for every cell of every notebook, in reading order; import lines blanked."""
    out = []
    for path in SOURCES:
        for i, source in enumerate(_parse(path)):
            out.append((path.stem, i, ["" if IMPORT.match(line) else line for line in source.split("\n")]))
    return out


def anchors() -> list[str]:
    return ANCHOR.findall(GLOSSARY.read_text(encoding="utf-8"))


def first_use(cells, pattern: str) -> tuple[int, int] | None:
    """(position in reading order, line) of the pattern's first match, or None."""
    rx = re.compile(pattern)
    for k, (_, _, lines) in enumerate(cells):
        for j, line in enumerate(lines):
            if rx.search(LINK.sub("", line)):
                return k, j
    return None


def first_link(cells, anchor: str) -> tuple[int, int] | None:
    for k, (_, _, lines) in enumerate(cells):
        for j, line in enumerate(lines):
            if anchor in LINK.findall(line):
                return k, j
    return None


def defined_late(cells, anchor: str, pattern: str) -> str | None:
    """Why the term is used before its definition, or None when it is not."""
    use = first_use(cells, pattern)
    if use is None:
        return None
    where = f"{cells[use[0]][0]} cell {cells[use[0]][1]}, line {use[1] + 1}: {cells[use[0]][2][use[1]].strip()[:80]!r}"
    link = first_link(cells, anchor)
    if link is None:
        return f"{anchor}: first used in {where}, and no notebook links ../docs/glossary.md#{anchor}"
    if link[0] <= use[0]:  # the link is in the cell of the first use, or in one before it
        return None
    return (f"{anchor}: first used in {where}; its glossary link comes later, in "
            f"{cells[link[0]][0]} cell {cells[link[0]][1]}")


def broken_links(cells, known: set[str]) -> list[str]:
    return [f"{nb} cell {i}: ../docs/glossary.md#{a} has no such anchor"
            for nb, i, lines in cells for line in lines for a in LINK.findall(line) if a not in known]


@pytest.fixture(scope="module")
def cells():
    return _cells()


def test_glossary_anchors_are_unique_and_match_the_terms():
    found = anchors()
    assert len(found) == len(set(found)), f"duplicate anchors: {sorted({a for a in found if found.count(a) > 1})}"
    assert set(found) == set(TERMS), (f"in the glossary, not in TERMS: {sorted(set(found) - set(TERMS))}; "
                                      f"in TERMS, not in the glossary: {sorted(set(TERMS) - set(found))}")


def test_every_entry_names_the_notebook_that_first_uses_it():
    text = GLOSSARY.read_text(encoding="utf-8")
    entries = ANCHOR.split(text)[1:]  # anchor, body, anchor, body …
    missing = [a for a, body in zip(entries[::2], entries[1::2]) if not re.search(r"First used: notebook \d\d[a-z]?\b", body)]
    assert not missing, f"entries without 'First used: notebook NN': {missing}"


def test_each_term_is_defined_at_or_before_its_first_use(cells):
    late = [why for anchor, pattern in TERMS.items() if (why := defined_late(cells, anchor, pattern))]
    assert not late, "\n".join(late)


def test_notebook_links_to_the_glossary_point_at_existing_anchors(cells):
    assert not broken_links(cells, set(anchors()))


def test_glossary_names_the_notebook_that_defines_the_term(cells):
    """Each entry's 'First used: notebook NN' is the notebook whose cell first links it (at or before the first use:
    a term can first appear in a cell's output, a table column, before any source spells it)."""
    text = GLOSSARY.read_text(encoding="utf-8")
    entries = ANCHOR.split(text)[1:]
    said = {a: re.search(r"First used: notebook (\d\d[a-z]?)\b", body) for a, body in zip(entries[::2], entries[1::2])}
    wrong = []
    for anchor in TERMS:
        link = first_link(cells, anchor)
        if link is not None and said.get(anchor) and said[anchor].group(1) != cells[link[0]][0].split("_")[0]:
            wrong.append(f"{anchor}: the glossary says notebook {said[anchor].group(1)}, first linked in {cells[link[0]][0]}")
    assert not wrong, "\n".join(wrong)


def test_the_checks_catch_a_late_definition_and_a_broken_link():
    fake = [("00_a", 0, ["The TTFT of one answer."]), ("00_a", 1, ["[TTFT](../docs/glossary.md#ttft): time to first token"]),
            ("01_b", 0, ["see [it](../docs/glossary.md#no-such-term)"])]
    assert defined_late(fake, "ttft", TERMS["ttft"]) is not None
    assert defined_late(fake[1:], "ttft", TERMS["ttft"]) is None
    assert broken_links(fake, set(TERMS)) == ["01_b cell 0: ../docs/glossary.md#no-such-term has no such anchor"]


@pytest.mark.parametrize("doc", ["README.md", "docs/instructor.md"])
def test_readme_and_instructor_guide_link_the_glossary(doc):
    assert "glossary.md" in (ROOT / doc).read_text(encoding="utf-8"), f"{doc} does not link docs/glossary.md"


def test_built_notebooks_link_the_docs_wherever_they_run():
    """A relative ../docs link breaks on Colab, on Kaggle and in a deck: the built notebooks link the project's copy."""
    built = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    assert built
    relative = [p.name for p in built if "](../" in p.read_text(encoding="utf-8")]
    assert not relative, f"relative links in {relative}: build them with tools/nbbuild.py"
    linked = [p for p in built if "../docs/glossary.md#" in (ROOT / "notebooks" / "src" / f"{p.stem}.py").read_text("utf-8")]
    assert linked and all("/blob/main/docs/glossary.md#" in p.read_text(encoding="utf-8") for p in linked)
