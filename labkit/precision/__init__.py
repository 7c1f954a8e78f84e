"""Fewer bits per number: the quantisers the learner writes, the libraries that do it for real, and one
loader that measures each precision's speed, memory and quality the same way.

``quantisers``   absmax scales, the symmetric int8 round trip, NF4, KV quantisation: the lesson's arithmetic
``variants``     one loader for every precision variant (PyTorch, bitsandbytes, ONNX Runtime), one spec each
``measure``      one measurement for every variant: speed, memory and quality on the same inputs, one row each
``libraries``    what bitsandbytes and ONNX Runtime really do with a layer, checked against the hand quantisers
``calibration``  static int8 scales from calibration prompts, scored on held-out ones
``kvquant``      a quantised KV cache at long context (transformers' ``QuantizedCache`` and the lab's own)
``formats``      FP8 (E4M3, E5M2), MXFP4 and NVFP4 written from their definitions: fake quantisation, bits per weight, error
``fp8_gemm``     one linear layer in fp32, bf16, FP8 upcast and torch._scaled_mm, timed in interleaved rounds
``rounds``       every variant measured alone for memory and quality, then its decode timed in interleaved rounds

precision knows nothing about serving or compiled engines: it never imports ``labkit.engines`` or
``labkit.serve``. The ONNX export it quantises lives below it, in ``labkit.model.onnx``.
"""
