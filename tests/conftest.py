"""Shared fixtures: a tiny random model (fast unit tests) and the real bundled model."""
import json
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"   # screenshots and server logs from a test run (git-ignored)
sys.path.insert(0, str(ROOT))

from engine import model as model_mod  # noqa: E402
from engine.loadgen import CORPUS  # noqa: E402

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<eos>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def tiny_tokenizer():
    """A byte-level BPE (vocab 400) trained in well under a second on the shipped corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<eos>", "<|user|>", "<|assistant|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tk.train_from_iterator([CORPUS.read_text()], trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<eos>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_bundle(seed=0, layers=2):
    """A randomly initialised Llama from a config; init scaled up so logits are well separated."""
    from transformers import LlamaConfig, LlamaForCausalLM
    tok = tiny_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      initializer_range=0.2, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
                      bos_token_id=None, tie_word_embeddings=True)
    torch.manual_seed(seed)
    m = LlamaForCausalLM(cfg).eval()
    m.generation_config.eos_token_id = tok.eos_token_id
    m.generation_config.pad_token_id = tok.eos_token_id
    return model_mod.ModelBundle(m, tok, "tiny-random-llama", "cpu", torch.float32, 0.0, False)


@pytest.fixture(scope="session")
def tiny():
    return tiny_bundle()


@pytest.fixture(scope="session")
def real():
    """The bundled SmolLM2-135M-Instruct (dequantised once, then loaded from the disk cache)."""
    return model_mod.load()


def frames(conn, seconds, until=None):
    """Events from a websocket for up to `seconds`, or until `until(events)` holds."""
    events, end = [], time.time() + seconds
    while time.time() < end:
        raw = conn.receive(timeout=0.2)
        if raw:
            events += json.loads(raw)
            if until and until(events):
                break
    return events


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python app.py` in a subprocess on a free loopback port, waited on until /healthz is ok."""

    def __init__(self, *args, timeout=180, port=None):
        import subprocess
        import time
        import requests
        self.port = port or free_port()   # a fixed port: a restarted server where pages reconnect
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = list(args)
        ARTIFACTS.mkdir(exist_ok=True)
        self.log = open(ARTIFACTS / f"server-{self.port}.log", "w")
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(self.port), *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}; see {self.log.name}")
            try:
                if requests.get(self.url + "/healthz", timeout=2).json().get("status") == "ok":
                    return
            except (requests.RequestException, ValueError):
                pass
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"server not ready in {timeout} s; see {self.log.name}")

    @property
    def ws_url(self):
        return f"ws://127.0.0.1:{self.port}/ws"

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except Exception:
                self.proc.kill()
        self.log.close()


@pytest.fixture(scope="session")
def server():
    """One shared app on the real model for HTTP/websocket/browser tests.

    Tests that change settings must restore them (or use their own `Server`)."""
    # One model thread: on a 2-core machine the browser under test needs the other core, and
    # two model threads contending with it stall each other (docs/performance.md).
    s = Server("--threads", "1")
    yield s
    s.stop()
