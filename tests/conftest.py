import os
import signal
import tempfile

import pytest

os.environ.setdefault("LABKIT_QUICK", "1")
# checks and reveals run in tests write a progress record: never the learner's own
os.environ["LABKIT_PROGRESS"] = os.path.join(tempfile.mkdtemp(prefix="labkit-progress-"), "progress.json")


@pytest.fixture(scope="session")
def tiny_llama():
    """A small random Llama (built in memory, no files) with the default model's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from labkit.model import models

    torch.manual_seed(0)
    tok = models.load_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id)
    model = LlamaForCausalLM(cfg).eval()
    return model, tok


@pytest.fixture(scope="session")
def default_lm():
    from labkit.model import models

    return models.load(dtype="fp32")


@pytest.fixture(scope="module")
def server():
    """The tiny random model's server on a free port, one per test module that asks for it (a module that
    defines its own ``server`` fixture uses that one instead)."""
    from labkit.serve import launch, protocol

    with launch.run_server(protocol.TINY_RANDOM, port=0, max_batch_size=8, max_prompt_tokens=512,
                            max_body_bytes=200_000) as srv:
        yield srv


@pytest.fixture
def alarm():
    """A test that would hang fails instead: SIGALRM raises inside the launcher, which then stops its children."""
    def ring(signum, frame):
        raise TimeoutError("the launcher did not return in time")
    old = signal.signal(signal.SIGALRM, ring)
    signal.alarm(90)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)
