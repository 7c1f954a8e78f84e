# Typical wrong answers to notebook 01's exercises: each check must call them wrong, with a reason.

# %% exercise 01.weight_bytes
def weight_bytes(config, bytes_per_param):
    # sizes k_proj and v_proj like q_proj: ignores grouped-query attention
    h = config.hidden_size
    per_layer = 4 * h * h + 3 * h * config.intermediate_size + 2 * h
    head = 0 if config.tie_word_embeddings else config.vocab_size * h
    return (config.vocab_size * h + config.num_hidden_layers * per_layer + h + head) * bytes_per_param


# %% exercise 01.weight_bytes
def weight_bytes(config, bytes_per_param):
    # counts the output head even when it is tied to the embedding
    h, hd = config.hidden_size, config.head_dim
    attn = 2 * h * config.num_attention_heads * hd + 2 * h * config.num_key_value_heads * hd
    per_layer = attn + 3 * h * config.intermediate_size + 2 * h
    return (2 * config.vocab_size * h + config.num_hidden_layers * per_layer + h) * bytes_per_param


# %% exercise 01.weight_bytes
def weight_bytes(config, bytes_per_param):
    # parameters, not bytes
    h, hd = config.hidden_size, config.head_dim
    attn = 2 * h * config.num_attention_heads * hd + 2 * h * config.num_key_value_heads * hd
    per_layer = attn + 3 * h * config.intermediate_size + 2 * h
    head = 0 if config.tie_word_embeddings else config.vocab_size * h
    return config.vocab_size * h + config.num_hidden_layers * per_layer + h + head


# %% exercise 01.decode_ceiling
def decode_ceiling(weight_bytes, kv_bytes_per_token, context, batch, bandwidth_bytes_per_s):
    # per sequence: forgets that one step yields a token for every sequence of the batch
    return bandwidth_bytes_per_s / (weight_bytes + kv_bytes_per_token * context * batch)


# %% exercise 01.decode_ceiling
def decode_ceiling(weight_bytes, kv_bytes_per_token, context, batch, bandwidth_bytes_per_s):
    # leaves the KV cache out
    return batch * bandwidth_bytes_per_s / weight_bytes


# %% exercise 01.decode_ceiling
def decode_ceiling(weight_bytes, kv_bytes_per_token, context, batch, bandwidth_bytes_per_s):
    # seconds per token, not tokens per second
    return (weight_bytes + kv_bytes_per_token * context * batch) / (batch * bandwidth_bytes_per_s)


# %% exercise 01.kv_layer_by_layer
def kv_layer_by_layer(config, context, bytes_per_value):
    # the naive formula: every layer full attention of one size
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    hd = config.get("head_dim") or config["hidden_size"] // heads
    return 2 * config["num_hidden_layers"] * kv * hd * bytes_per_value * context


# %% exercise 01.kv_layer_by_layer
def kv_layer_by_layer(config, context, bytes_per_value):
    # forgets the window: sliding layers counted like full ones
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    hd = config.get("head_dim") or config["hidden_size"] // heads
    types = config.get("layer_types") or ["full_attention"] * config["num_hidden_layers"]
    total = 0
    for kind in types:
        if kind == "full_attention":
            total += context * 2 * (config.get("num_global_key_value_heads") or kv) * (config.get("global_head_dim") or hd)
        elif kind == "sliding_attention":
            total += context * 2 * kv * hd
    return total * bytes_per_value
