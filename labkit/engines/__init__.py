"""Other ways to run the same model: compiled, exported, fused, or another runtime altogether.

``compiled``     a static-cache decoder, eager or ``torch.compile``, on the decode core
``fusion``       RMSNorm written by hand, the kernels eager runs, what inductor fuses and what it saves
``onnxruntime``  ONNX Runtime sessions at each graph-optimisation level, and its TensorRT provider's options
``tensorrt``     rows for ONNX Runtime's TensorRT provider and torch-tensorrt, each with the reason it cannot run
``cpu``          the lab's CPU paths beside llama.cpp and ONNX Runtime's 4-bit blocks
``llamacpp``     llama.cpp on the default model's own GGUF
``warmup``       what the first request pays, and the warmup a server runs before traffic

engines knows one request at a time: no batching policy, no HTTP, no quantiser of its own (it never
imports ``labkit.precision`` or ``labkit.serve``). Whether a backend exists here is ``labkit.core.env``'s
answer, never guessed.
"""
