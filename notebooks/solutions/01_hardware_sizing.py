# Solutions to notebook 01's exercises (run with `python -m tools.run_notebooks --only 01 --solutions`).

# %% exercise 01.weight_bytes
def weight_bytes(config, bytes_per_param):
    """Bytes of a Llama-architecture model's weights (no biases), from its config."""
    h, layers = config.hidden_size, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or h // config.num_attention_heads
    attention = 2 * h * config.num_attention_heads * head_dim  # q_proj and o_proj
    attention += 2 * h * config.num_key_value_heads * head_dim  # k_proj and v_proj: the KV heads only
    mlp = 3 * h * config.intermediate_size  # gate_proj, up_proj, down_proj
    per_layer = attention + mlp + 2 * h  # two RMSNorm weights
    embeddings = config.vocab_size * h
    head = 0 if config.tie_word_embeddings else config.vocab_size * h  # a tied head reuses the embedding
    return (embeddings + layers * per_layer + h + head) * bytes_per_param  # + the final RMSNorm


# %% exercise 01.decode_ceiling
def decode_ceiling(weight_bytes, kv_bytes_per_token, context, batch, bandwidth_bytes_per_s):
    """Most aggregate tokens/s decode can reach: one step reads every weight once and each sequence's KV cache."""
    step_bytes = weight_bytes + kv_bytes_per_token * context * batch
    return batch * bandwidth_bytes_per_s / step_bytes  # one token per sequence per step


# %% exercise 01.kv_layer_by_layer
def kv_layer_by_layer(config, context, bytes_per_value):
    """KV-cache bytes one sequence keeps, layer by layer: full layers every token, sliding ones their window,
    linear-attention ones no tokens."""
    n = config["num_hidden_layers"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    window = config.get("sliding_window")
    types = config.get("layer_types") or ["sliding_attention" if window else "full_attention"] * n
    total = 0
    for kind in types:
        if kind == "full_attention":
            per_token = 2 * (config.get("num_global_key_value_heads") or kv_heads) * (config.get("global_head_dim") or head_dim)
            total += context * per_token
        elif kind == "sliding_attention":
            total += min(context, window) * 2 * kv_heads * head_dim
    return total * bytes_per_value
