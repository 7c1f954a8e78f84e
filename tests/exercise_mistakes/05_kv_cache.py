# Typical wrong answers to notebook 05's exercises: each check must call them wrong, with a reason.

# %% exercise 05.decode_step
def decode_step(model, tokens, cache, position_ids):
    # forgets the cache: the new token sees nothing before it
    return model(input_ids=tokens[:, None]).logits[:, -1]


# %% exercise 05.decode_step
def decode_step(model, tokens, cache, position_ids):
    # keeps the length-1 sequence dimension: (B, 1, V)
    return model(input_ids=tokens[:, None], past_key_values=cache, use_cache=True).logits


# %% exercise 05.kv_bytes_per_token
def kv_bytes_per_token(config, bytes_per_value):
    # counts every attention head, not the key/value heads
    head_dim = config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_attention_heads * head_dim * bytes_per_value


# %% exercise 05.kv_bytes_per_token
def kv_bytes_per_token(config, bytes_per_value):
    # derives head_dim from hidden_size, which a config may override
    head_dim = config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * bytes_per_value


# %% exercise 05.kv_bytes_per_token
def kv_bytes_per_token(config, bytes_per_value):
    # counts the values but not their bytes
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim
