"""Running a model one token at a time, and judging what comes out.

``decode``          the decode core: prefill, one batched decode step, greedy loops with and without the cache
``generation``      TTFT / ITL / TPOT as vLLM defines them, timed through a streamer
``quality``         perplexity, greedy agreement and KL against a reference
``invariance``      one prompt's greedy answer alone and inside batches: where it parts, and by how much
``kv``              the KV cache measured: bytes, on vs off, dynamic vs static, attention implementations
``cache_variants``  transformers' cache and compile knobs that ``kv`` and the engines share
``sampling``        greedy or temperature/top-p choice of the next token, seeded per request
``speculative``     draft several tokens, check them in one forward pass
``constrained``     structured outputs by hand: a token mask for a choice or a pattern, in the greedy loop
``grammar``         structured outputs by xgrammar: schemas compiled once per tokenizer, per-sequence grammar masks
``profiling``       torch.profiler over one prefill and one decode step, grouped by operator kind

decoding knows one model in one process: no quantiser, no exported engine, no request queue or HTTP.
Batches here are tensors handed in by the caller; who decides what goes in a batch is ``labkit.serve``'s job.
"""
