"""Open-loop load: Poisson arrivals at a set rate, with real prompts of a set token length.

Prompts are windows of a shipped public-domain text (`data/corpus.txt`), cut to the
requested number of tokens and decoded back to text, so the tokenizer and prefill both
do real work. Open loop: arrivals do not wait for earlier requests to finish.
"""
from pathlib import Path
import random

CORPUS = Path(__file__).with_name("data") / "corpus.txt"
# Tasks a load request may ask of its corpus window, as a chat message: `copy` has the model
# repeat a given text, so its output is mostly in its prompt (speculative decoding's lesson).
TASKS = {"copy": "Copy the following text exactly, word for word:\n\n{text}"}


class LoadGenerator:
    def __init__(self, tokenizer, seed=0):
        self.tokenizer = tokenizer
        self.ids = tokenizer(CORPUS.read_text(), add_special_tokens=False)["input_ids"]
        self.rng = random.Random(seed)
        self.next_arrival = None

    def prompt(self, n_tokens, shared_prefix=0, rng=None):
        """Text of about `n_tokens` tokens, starting at a random place (the corpus wraps round).
        The first `shared_prefix` tokens are the corpus's opening ones, the same for every call:
        prompts that share a system prompt. `rng` (a seeded random.Random) picks the places
        instead of the generator's own: the same seed gives the same prompts."""
        shared = min(shared_prefix, n_tokens)
        start = (rng or self.rng).randrange(len(self.ids))
        window = self.ids[:shared] + [self.ids[(start + i) % len(self.ids)] for i in range(n_tokens - shared)]
        return self.tokenizer.decode(window)

    def due(self, now, on, rate):
        """How many arrivals are due by `now` (exponential gaps at `rate`/s while on)."""
        if not on:
            self.next_arrival = None
            return 0
        if self.next_arrival is None:
            self.next_arrival = now + self.rng.expovariate(rate)
        n = 0
        while self.next_arrival <= now:
            n += 1
            self.next_arrival += self.rng.expovariate(rate)
        return n

    def restart(self):
        """Forget the scheduled arrival (the rate changed)."""
        self.next_arrival = None
