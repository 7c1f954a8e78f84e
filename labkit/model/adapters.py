"""Many adapters, one model: LoRA adapters written in PEFT's layout, their bytes, and their greedy answers.

A LoRA adapter adds ``scaling · B @ A`` to each target Linear (``A``: r × in, ``B``: out × r, scaling = alpha / r),
so it stores ``r × (in + out)`` numbers per target per layer, a few MB beside the base's hundreds. A server holds
one base and many adapters, and picks the adapter per request.

``make_adapters`` writes N adapters for a base model (``adapter_config.json`` + ``adapter_model.safetensors``,
what ``vllm serve --lora-modules`` and ``PeftModel.from_pretrained`` read). A fresh LoRA has ``B = 0`` and changes
nothing, so each adapter gets its own seeded ``A`` and ``B``, scaled so that every target's update has the Frobenius
norm ``strength × ‖W‖``: a seeded nudge, the same size for every adapter, that moves greedy answers away from the
base's and from each other's (``train_steps`` > 0 trains ``B`` from zero on the lab's text instead).

``adapter_bytes`` / ``n_adapters_vs_copies`` are the arithmetic, from the model's config; ``weights_bytes`` reads
what a written file holds. ``merged_greedy`` is the reference for a server's answers: transformers and PEFT,
the adapter merged into the weights (``merge_and_unload``), greedy, each prompt alone.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..core.checks import positive
from . import tensorfile
from .dtypes import DTYPE_BYTES, normalize_dtype, torch_dtype
from .prompts import eval_text
from .sizing import shape, weight_bytes

RECIPE = "labkit-adapter.json"  # how an adapter folder was made: a folder whose recipe matches is reused
RECIPE_FORMAT = 1
CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_STRENGTH = 0.1  # ‖ΔW‖ / ‖W‖ of each target of a seeded adapter
TRAIN_LR, TRAIN_WINDOW = 1e-3, 128  # train_steps > 0: AdamW's step size and the tokens of text per step


# ---------------------------------------------------------------------------------------- the arithmetic


def target_shapes(config: Any) -> dict[str, tuple[int, int]]:
    """(in, out) features of each Linear a LoRA can target in one decoder layer of a Llama-style ``config``."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    inter = config.intermediate_size
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv * head_dim), "v_proj": (hidden, kv * head_dim),
            "o_proj": (heads * head_dim, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden)}


def _check_targets(targets: Sequence[str]) -> tuple[str, ...]:
    if isinstance(targets, str) or not targets:
        raise ValueError(f"targets={targets!r}: give a tuple of module names, e.g. ('q_proj', 'v_proj')")
    unknown = [t for t in targets if t not in TARGETS]
    if unknown:
        raise ValueError(f"targets {unknown}: not a Linear of a Llama-style layer; choose from {TARGETS}")
    return tuple(targets)


def adapter_params(config: Any, rank: int, targets: Sequence[str] = ("q_proj", "v_proj")) -> int:
    """Numbers one adapter stores: layers × Σ over targets of r × (in + out)."""
    positive("rank", rank)
    shapes = target_shapes(config)
    return config.num_hidden_layers * sum(rank * sum(shapes[t]) for t in _check_targets(targets))


def adapter_bytes(config: Any, rank: int, targets: Sequence[str] = ("q_proj", "v_proj"), dtype: str = "fp32") -> int:
    """Bytes of one adapter's tensors in ``dtype`` (its safetensors file adds a small JSON header)."""
    return adapter_params(config, rank, targets) * DTYPE_BYTES[normalize_dtype(dtype)]


def n_adapters_vs_copies(n: int, config: Any, rank: int = 8, targets: Sequence[str] = ("q_proj", "v_proj"),
                         dtype: str = "fp32") -> dict[str, Any]:
    """N fine-tuned variants two ways: one base plus N adapters, against N full copies of the model (bytes)."""
    positive("n", n)
    base = weight_bytes(shape(config), normalize_dtype(dtype))
    one = adapter_bytes(config, rank, targets, dtype)
    return {"n": n, "rank": rank, "targets": tuple(targets), "dtype": normalize_dtype(dtype), "base_bytes": base,
            "adapter_bytes": one, "adapter_share_of_base": one / base, "base_plus_adapters_bytes": base + n * one,
            "full_copies_bytes": n * base, "saving": n * base / (base + n * one)}


def weights_bytes(path: str | Path) -> int:
    """Bytes of the tensors an adapter's weights file holds (``path``: the file, or the adapter's folder), read
    from its safetensors header (the file is the header plus these)."""
    path = Path(path)
    if path.is_dir():
        path = path / WEIGHTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no adapter weights there; write them with make_adapters()")
    return tensorfile.payload_bytes(path)


# ---------------------------------------------------------------------------------------- writing adapters


def _recipe(model_path: str, name: str, rank: int, alpha: int, targets: tuple[str, ...], seed: int,
            train_steps: int, strength: float, text: str | None) -> dict[str, Any]:
    return {"format": RECIPE_FORMAT, "base": str(model_path), "name": name, "rank": rank, "alpha": alpha,
            "targets": list(targets), "seed": seed, "train_steps": train_steps,
            "init": "trained" if train_steps else "seeded", "strength": None if train_steps else strength,
            "text_chars": len(text) if train_steps and text is not None else None}


def _reusable(folder: Path, recipe: Mapping[str, Any]) -> bool:
    try:
        kept = json.loads((folder / RECIPE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return kept == dict(recipe) and (folder / CONFIG_FILE).is_file() and (folder / WEIGHTS_FILE).is_file()


def _seeded(peft_model: Any, seed: int, strength: float) -> None:
    """Each LoRA pair drawn from ``seed``'s generator, then scaled so that ‖scaling · B @ A‖ = strength · ‖W‖."""
    import torch

    gen = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for _, module in sorted(peft_model.named_modules(), key=lambda kv: kv[0]):
            if not hasattr(module, "lora_A") or "default" not in module.lora_A:
                continue
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            a.copy_(torch.randn(a.shape, generator=gen, device="cpu", dtype=torch.float32).to(a.device, a.dtype))
            b.copy_(torch.randn(b.shape, generator=gen, device="cpu", dtype=torch.float32).to(b.device, b.dtype))
            delta = module.scaling["default"] * (b.float() @ a.float())
            b.mul_(strength * module.base_layer.weight.float().norm() / delta.norm())


def _trained(peft_model: Any, tokenizer: Any, text: str, seed: int, steps: int) -> None:
    """``steps`` AdamW steps of next-token loss on windows of ``text`` drawn with ``seed`` (B starts at zero)."""
    import torch

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) < TRAIN_WINDOW + 1:
        raise ValueError(f"text of {len(ids)} tokens: training needs at least {TRAIN_WINDOW + 1}; pass a longer text")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    device = next(peft_model.parameters()).device
    params = [p for p in peft_model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=TRAIN_LR)
    peft_model.train()
    for _ in range(steps):
        start = int(torch.randint(0, len(ids) - TRAIN_WINDOW, (1,), generator=gen, device="cpu"))
        window = torch.tensor([ids[start:start + TRAIN_WINDOW]], device=device)
        loss = peft_model(input_ids=window, labels=window).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    peft_model.eval()


def make_adapters(model_path: str, out_dir: str | Path, names: Sequence[str], rank: int = 8, alpha: int = 16,
                  targets: Sequence[str] = ("q_proj", "v_proj"), seed: int = 0, train_steps: int = 0,
                  text: str | None = None, strength: float = DEFAULT_STRENGTH) -> dict[str, Path]:
    """Write one LoRA adapter per name under ``out_dir/<name>`` (PEFT's layout) for the model at ``model_path``;
    adapter i uses seed ``seed + i``. A folder whose recipe (``labkit-adapter.json``) matches is reused as it is.

    ``train_steps`` 0: seeded ``A`` and ``B`` scaled to ``strength`` (see the module docstring). Above 0: ``B``
    from zero, trained that many steps on ``text`` (default: the lab's evaluation text). Returns name → folder.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    names = list(names)
    if not names or len(set(names)) != len(names) or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise ValueError(f"names={names!r}: give distinct identifiers, e.g. ['support', 'legal'] "
                         "(each is a folder and a model name a server answers to)")
    positive("rank", rank)
    positive("alpha", alpha)
    targets = _check_targets(targets)
    if isinstance(train_steps, bool) or not isinstance(train_steps, int) or train_steps < 0:
        raise ValueError(f"train_steps={train_steps!r}: 0 (seeded adapters) or a positive number of steps")
    if not train_steps and not 0 < strength <= 1:
        raise ValueError(f"strength={strength!r}: the update's size relative to each weight, in (0, 1]; try 0.3")
    if train_steps and text is None:
        text = eval_text()
    out = Path(out_dir)
    folders = {n: out / n for n in names}
    recipes = {n: _recipe(model_path, n, rank, alpha, targets, seed + i, train_steps, strength, text)
               for i, n in enumerate(names)}
    todo = [n for n in names if not _reusable(folders[n], recipes[n])]
    if not todo:
        return folders
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_path) if train_steps else None
    out.mkdir(parents=True, exist_ok=True)
    for n in todo:
        recipe = recipes[n]
        torch.manual_seed(recipe["seed"])  # PEFT draws A from the global generator; _seeded redraws both anyway
        config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, bias="none",
                            task_type="CAUSAL_LM")
        model = get_peft_model(base, config)
        if train_steps:
            _trained(model, tokenizer, text, recipe["seed"], train_steps)
        else:
            _seeded(model, recipe["seed"], strength)
        tmp = Path(tempfile.mkdtemp(prefix=f".{n}-", dir=out))  # written beside, then renamed: never half a folder
        try:
            model.save_pretrained(tmp)
            (tmp / RECIPE).write_text(json.dumps(recipe, indent=1) + "\n", encoding="utf-8")
            if folders[n].exists():
                shutil.rmtree(folders[n])
            tmp.rename(folders[n])
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        base = model.unload()  # the base without LoRA layers, for the next adapter
    return folders


def adapter_rank(folder: str | Path) -> int:
    """The rank ``r`` an adapter folder's ``adapter_config.json`` declares."""
    path = Path(folder) / CONFIG_FILE
    try:
        return int(json.loads(path.read_text(encoding="utf-8"))["r"])
    except (OSError, ValueError, KeyError) as exc:
        raise ValueError(f"{path}: not a PEFT adapter config ({exc}); write adapters with make_adapters()") from exc


# ---------------------------------------------------------------------------------------- greedy references


def merged_greedy(model_path: str, adapter_dir: str | Path | None, prompts_ids: Sequence[Sequence[int]],
                  max_new_tokens: int, dtype: str = "fp32") -> list[list[int]]:
    """Greedy answers (new token ids, up to and with end-of-sequence) of each prompt alone, from the base with the
    adapter at ``adapter_dir`` merged into its weights (``merge_and_unload``); ``adapter_dir`` None: the base's."""
    import torch
    from transformers import AutoModelForCausalLM

    positive("max_new_tokens", max_new_tokens)
    if not prompts_ids or any(len(p) == 0 for p in prompts_ids):
        raise ValueError("prompts_ids: give one or more non-empty lists of token ids (e.g. models.chat_ids(...))")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype(dtype))
    if adapter_dir is not None:
        from peft import PeftModel

        adapter_rank(adapter_dir)  # a clear error for a folder that is not an adapter
        model = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    model.eval()
    pad = model.generation_config.pad_token_id
    pad = pad if pad is not None else model.generation_config.eos_token_id
    answers = []
    with torch.inference_mode():
        for p in prompts_ids:
            ids = torch.tensor([[int(i) for i in p]], device="cpu")
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids, device="cpu"), do_sample=False,
                                 max_new_tokens=max_new_tokens, pad_token_id=pad)
            answers.append(gen[0, ids.shape[1]:].tolist())
    return answers


def greedy_table(model_path: str, adapters: Mapping[str, str | Path], prompts_ids: Sequence[Sequence[int]],
                 max_new_tokens: int) -> dict[str, list[list[int]]]:
    """``merged_greedy`` of the base (key ``"base"``) and of each adapter, by name."""
    if "base" in adapters:
        raise ValueError("an adapter named 'base': rename it, 'base' stands for the model without an adapter")
    return {"base": merged_greedy(model_path, None, prompts_ids, max_new_tokens),
            **{n: merged_greedy(model_path, d, prompts_ids, max_new_tokens) for n, d in adapters.items()}}
