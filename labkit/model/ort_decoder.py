"""An exported decoder run by ONNX Runtime itself: one ``InferenceSession``, its KV cache fed back each step.

``OrtCausalLM`` is what the lab runs an ONNX export with (notebooks 03, 08 and 10). It answers the calls labkit
makes on a transformers model, no more: ``model(input_ids=..., attention_mask=...)`` returns ``.logits``, and
``generate`` decodes greedily (``min_new_tokens``, ``pad_token_id``, end of sequence, a ``streamer``). The decode
loop is the one notebook 05 writes by hand: feed the prompt once, then one token per step with the keys and
values the last step returned (``present.*`` in, as ``past_key_values.*``). With ``use_io_binding`` (what labkit
asks for on a GPU) every input and cache tensor is bound on the session's device, so the cache never leaves it;
without it, inputs and the cache go in and out as numpy arrays (the CPU's case).

The graph it runs takes ``input_ids``, ``attention_mask`` (past plus new tokens), ``position_ids`` where the
graph has it, and one ``past_key_values.N.key``/``.value`` pair per layer; it returns ``logits`` and one
``present.N.key``/``.value`` pair per layer. The exporters in ``labkit.model.onnx`` write that form.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

_PAST = re.compile(r"past_key_values\.(\d+)\.(key|value)$")
_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16"}


class _Output:
    """What a forward pass returns: ``.logits`` (torch, on the CPU) and the cache as ORT values."""

    def __init__(self, logits: Any, present: list[Any]) -> None:
        self.logits = logits
        self.past_key_values = present


class OrtCausalLM:
    """A causal LM in an ONNX Runtime session; ``from_pretrained(folder, providers=..., provider_options=...)``.

    ``session`` is the ``InferenceSession`` (``get_providers()`` says what really runs), ``device`` the torch
    device its outputs come from, ``config`` and ``generation_config`` what transformers wrote beside the graph.
    """

    def __init__(self, session: Any, config: Any, generation_config: Any, device: Any,
                 use_io_binding: bool = False) -> None:
        self.session = session
        self.use_io_binding = use_io_binding
        self.folder: Path | None = None  # where from_pretrained read the graph
        self.config = config
        self.generation_config = generation_config
        self.device = device
        names = [i.name for i in session.get_inputs()]
        self.input_names = names
        self.past_names = sorted((n for n in names if _PAST.match(n)),
                                 key=lambda n: (int(_PAST.match(n).group(1)), _PAST.match(n).group(2) != "key"))
        missing = {"input_ids", "attention_mask"} - set(names)
        if missing or not self.past_names:
            raise ValueError(f"this ONNX graph is not a decoder with a KV cache: inputs {names}")
        outputs = [o.name for o in session.get_outputs()]
        self.present_names = [n.replace("past_key_values", "present") for n in self.past_names]
        if "logits" not in outputs or set(self.present_names) - set(outputs):
            raise ValueError(f"this ONNX graph does not return logits and present.N.key/value: outputs {outputs}")
        by_name = {i.name: i for i in session.get_inputs()}
        first = by_name[self.past_names[0]]
        self.cache_dtype = _ORT_TYPES.get(first.type, "float32")
        self.cache_shape = [d if isinstance(d, int) else None for d in first.shape]  # (batch, heads, past, head_dim)

    @classmethod
    def from_pretrained(cls, folder: str | Path, providers: list[str], provider_options: list[dict] | None = None,
                        session_options: Any = None, use_io_binding: bool = False) -> "OrtCausalLM":
        """A session on ``folder/model.onnx`` with ``providers`` (first one first) and the config files beside it."""
        import onnxruntime as ort
        import torch
        from transformers import AutoConfig, GenerationConfig

        folder = Path(folder)
        session = ort.InferenceSession(str(folder / "model.onnx"), sess_options=session_options,
                                       providers=list(providers), provider_options=provider_options)
        config = AutoConfig.from_pretrained(folder)
        try:
            generation_config = GenerationConfig.from_pretrained(folder)
        except OSError:
            generation_config = GenerationConfig.from_model_config(config)
        got = session.get_providers()[0]
        options = (provider_options or [{}])[0] if provider_options else {}
        on_gpu = got in ("CUDAExecutionProvider", "TensorrtExecutionProvider")
        device = torch.device("cuda", int(options.get("device_id", 0))) if on_gpu else torch.device("cpu")
        model = cls(session, config, generation_config, device, use_io_binding)
        model.folder = folder
        return model

    # ------------------------------------------------------------------ one forward pass

    def _ort_device(self) -> tuple[str, int]:
        return ("cuda", self.device.index or 0) if self.device.type == "cuda" else ("cpu", 0)

    def _value(self, array: Any) -> Any:
        import onnxruntime as ort

        if not self.use_io_binding:
            return array
        kind, index = self._ort_device()
        return ort.OrtValue.ortvalue_from_numpy(array, kind, index)

    def empty_cache(self, batch: int) -> list[Any]:
        """A cache holding no tokens: one (batch, heads, 0, head_dim) pair per layer."""
        import numpy as np

        _, heads, _, head_dim = self.cache_shape
        if heads is None or head_dim is None:
            heads = self.config.num_key_value_heads
            head_dim = getattr(self.config, "head_dim", None) or self.config.hidden_size // self.config.num_attention_heads
        dtype = np.float16 if self.cache_dtype == "float16" else np.float32
        return [self._value(np.zeros((batch, heads, 0, head_dim), dtype=dtype)) for _ in self.past_names]

    def forward(self, input_ids: Any, attention_mask: Any, past: list[Any] | None = None,
                position_ids: Any = None) -> _Output:
        """One pass: ``input_ids`` (batch, new) after the ``past`` cache (None: empty); ``attention_mask`` covers
        past and new tokens. Returns the logits of every new position and the cache grown by them."""
        import numpy as np
        import torch

        ids = np.ascontiguousarray(input_ids.detach().cpu().numpy().astype(np.int64))
        mask = np.ascontiguousarray(attention_mask.detach().cpu().numpy().astype(np.int64))
        past = self.empty_cache(ids.shape[0]) if past is None else past
        feed = {"input_ids": ids, "attention_mask": mask}
        if "position_ids" in self.input_names:
            if position_ids is None:
                position_ids = torch.from_numpy(np.clip(mask.cumsum(-1) - 1, 0, None)[:, -ids.shape[1]:])
            feed["position_ids"] = np.ascontiguousarray(position_ids.detach().cpu().numpy().astype(np.int64))
        feed.update(zip(self.past_names, past))
        if not self.use_io_binding:
            outputs = self.session.run(["logits", *self.present_names], feed)
            return _Output(torch.from_numpy(outputs[0]), list(outputs[1:]))
        binding = self.session.io_binding()
        for name, value in feed.items():
            binding.bind_ortvalue_input(name, value if name in self.past_names else self._value(value))
        kind, index = self._ort_device()
        binding.bind_output("logits", "cpu")
        for name in self.present_names:
            binding.bind_output(name, kind, index)
        self.session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        return _Output(torch.from_numpy(outputs[0].numpy()), list(outputs[1:]))

    def __call__(self, input_ids: Any, attention_mask: Any = None, **_: Any) -> _Output:
        """Logits of every position of ``input_ids`` from an empty cache (what ``quality`` scores with)."""
        import torch

        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        return self.forward(input_ids, mask)

    # ------------------------------------------------------------------ greedy decoding

    def _eos_ids(self, eos_token_id: Any) -> set[int]:
        eos = self.generation_config.eos_token_id if eos_token_id is None else eos_token_id
        if eos is None:
            return set()
        return {int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])}

    def generate(self, input_ids: Any, attention_mask: Any = None, max_new_tokens: int = 20, min_new_tokens: int = 0,
                 do_sample: bool = False, streamer: Any = None, pad_token_id: int | None = None,
                 eos_token_id: Any = None, **unused: Any) -> Any:
        """Greedy continuation of ``input_ids`` (left-padded in a batch): the prompt in one pass, then one token
        per step; a sequence that produced an end-of-sequence token goes on with ``pad_token_id``. Returns
        (batch, prompt + new) token ids, as transformers' ``generate`` does."""
        import torch

        if do_sample:
            raise ValueError("OrtCausalLM decodes greedily only: do_sample=False")
        if unused:
            raise TypeError(f"OrtCausalLM.generate does not take {sorted(unused)}")
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(input_ids.device)
        eos = self._eos_ids(eos_token_id)
        pad = pad_token_id if pad_token_id is not None else self.generation_config.pad_token_id
        pad = pad if pad is not None else (min(eos) if eos else 0)
        if streamer is not None:
            streamer.put(input_ids.cpu())
        out = self.forward(input_ids, mask)
        # the choice of the next token runs on the host: logits come back to the CPU (only the cache stays bound)
        tokens, done = input_ids.cpu(), torch.zeros(input_ids.shape[0], dtype=torch.bool, device="cpu")
        mask = mask.cpu()
        for step in range(max_new_tokens):
            logits = out.logits[:, -1].clone()
            if step < min_new_tokens and eos:
                logits[:, sorted(eos)] = float("-inf")
            nxt = torch.where(done, torch.full_like(done, pad, dtype=torch.long), logits.argmax(-1))
            tokens = torch.cat([tokens, nxt[:, None]], dim=1)
            if streamer is not None:
                streamer.put(nxt)
            done |= torch.isin(nxt, torch.tensor(sorted(eos), dtype=torch.long, device="cpu")) if eos else done
            if bool(done.all()) or step == max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = self.forward(nxt[:, None], mask, past=out.past_key_values)
        if streamer is not None:
            streamer.end()
        return tokens.to(input_ids.device)
