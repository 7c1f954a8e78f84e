# Solutions to notebook 05's exercises (run with `python -m tools.run_notebooks --only 05 --solutions`).

# %% exercise 05.decode_step
import torch


def decode_step(model, tokens, cache, position_ids):
    """One decode step with the KV cache: (B,) newest tokens at (B,) positions → (B, V) next-token logits."""
    out = model(input_ids=tokens[:, None], position_ids=position_ids[:, None],  # (B, 1): the new tokens only
                past_key_values=cache, use_cache=True)  # attends to the cached positions, appends its own K and V
    return out.logits[:, -1]


# %% exercise 05.kv_bytes_per_token
def kv_bytes_per_token(config, bytes_per_value):
    """Bytes the KV cache holds for one position of one sequence."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * bytes_per_value
