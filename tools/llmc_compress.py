"""Write a compressed-tensors checkpoint of a safetensors model folder with llm-compressor, on a CPU, without data.

Runs in `make llmc`'s environment (.venv-llmc: llm-compressor pins transformers below the lab's), never imports
labkit; bench/llm_compressor.py starts it as a child process:

    .venv-llmc/bin/python -m tools.llmc_compress MODEL_DIR SCHEME OUT_DIR [--api model_free|oneshot] [--ignore ...]

SCHEME is a compressed-tensors preset name: FP8_DYNAMIC, FP8_BLOCK, NVFP4A16, MXFP4A16, MXFP4, ...
``model_free`` (default) quantises the safetensors tensors directly (llmcompressor.model_free_ptq: no model class,
no transformers load); ``oneshot`` loads the model with transformers and applies a QuantizationModifier (data-free
schemes only here: no calibration set is passed). Prints one JSON line: scheme, api, seconds, bytes, versions.

Found with llmcompressor 0.14.0.1 / compressed-tensors 0.19.0 on SmolLM2-135M (hidden 576): NVFP4 and MXFP4 (W4A4)
need calibration data under both APIs; FP8_BLOCK's 128x128 blocks do not divide 576 (model_free then fails to save
a non-contiguous tensor; oneshot writes it, but vLLM refuses it). seconds excludes the llmcompressor import.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib.metadata import version
from pathlib import Path


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def versions() -> dict[str, str]:
    return {name: version(name) for name in ("llmcompressor", "compressed-tensors", "torch", "transformers")}


def compress_model_free(model_dir: str, scheme: str, out_dir: str, ignore: list[str]) -> None:
    from llmcompressor import model_free_ptq

    model_free_ptq(model_stub=model_dir, save_directory=out_dir, scheme=scheme, ignore=ignore, device="cpu")


def compress_oneshot(model_dir: str, scheme: str, out_dir: str, ignore: list[str]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    oneshot(model=model, recipe=QuantizationModifier(targets="Linear", scheme=scheme, ignore=ignore))
    model.save_pretrained(out_dir, save_compressed=True)
    tokenizer.save_pretrained(out_dir)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model_dir")
    ap.add_argument("scheme")
    ap.add_argument("out_dir")
    ap.add_argument("--api", choices=("model_free", "oneshot"), default="model_free")
    # model_free has no model definition: its target "Linear" matches every non-norm ``*.weight``, the embedding
    # included (with tied embeddings that is also the lm_head), so the embedding must be ignored by name.
    ap.add_argument("--ignore", nargs="*", default=["lm_head", "re:.*embed_tokens$"])
    a = ap.parse_args(argv)
    run = compress_model_free if a.api == "model_free" else compress_oneshot
    import llmcompressor  # noqa: F401  (imported before the clock starts: the import alone takes several seconds)

    start = time.monotonic()
    run(a.model_dir, a.scheme, a.out_dir, a.ignore)
    seconds = time.monotonic() - start
    qc = json.loads((Path(a.out_dir) / "config.json").read_text()).get("quantization_config", {})
    print(json.dumps({"scheme": a.scheme, "api": a.api, "out_dir": a.out_dir, "seconds": round(seconds, 1),
                      "bytes": folder_bytes(Path(a.out_dir)), "format": qc.get("format"), "versions": versions()}),
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
