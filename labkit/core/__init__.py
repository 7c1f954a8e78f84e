"""The ground floor: what every other package stands on, and nothing that knows about models.

``config``   paths and run-mode switches (``LABKIT_QUICK``, ``LABKIT_CACHE`` …), read from the environment
``env``      this machine and what it can run: the device, the one capability API (``capability(name)`` →
             available, reason) that ``python -m labkit info``, the notebooks and ``make gpu-check`` read
``gpu_features`` what a GPU can do: each feature's minimum compute capability, MPS's row, one wording of why not
``cpu``      the CPU: its /proc/cpuinfo lines, model name and instruction sets, and the line results name it with
``vllm_env`` vLLM's own environment (``make vllm``): its python, its version, whether it can serve here
``tensorrt_libs`` whether ONNX Runtime's TensorRT provider really gets TensorRT's libraries (a one-node session asked)
``compiler`` whether a C compiler builds a Python extension (what torch.compile's first use needs)
``timing``   the one clock: ``track``/``measure``/``now`` for device work, ``clock`` for host work, ``Measurement``
``memory``   peak memory (RSS sampler, CUDA peak, NVML) around a block of work
``energy``   joules over a block of work: RAPL, NVML energy or sampled power, or the reason it cannot be read
``results``  the JSON a notebook writes, with its environment, and the reference files it is read beside
``published`` published GPU figures (vendor and project tables, each with source and date), shown where no GPU
             reference ships and never beside a measurement
``checks``   checks every layer shares: a positive count, the device a model's inputs go to
``verdict``  the verdict on a ratio of two sample sets: better, worse, within noise, or implausible (beyond its bound)
``machine``  how busy this machine is (load, steal, other processes through psutil): the load line every notebook prints

core knows no model, no tokenizer and no lesson: it imports only the standard library at module level, and
torch or a backend inside the function that needs it, so ``import labkit.core`` works on any machine.
"""
