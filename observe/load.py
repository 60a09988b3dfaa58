"""Observe mode's load generator: engine/teach/loadgen.py's Poisson arrivals and corpus prompts, cut
for a server whose tokenizer is unknown here.

Prompts are cut from the corpus in whole words; the number of words for a requested token
count comes from the tokens-per-word ratio measured from the server's own
`usage.prompt_tokens` reports (one word per token until the first report). The estimate goes
out as `request.prompt_tokens` and says so (`estimated: true`); `finished.prompt_tokens` is
the server's count.
"""
import threading

from engine.teach.loadgen import LoadGenerator


class WordTokenizer:
    """Whitespace-separated words as tokens: lets LoadGenerator cut corpus prompts of N words."""

    def __init__(self):
        self.ids, self.words = {}, []

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [self._id(w) for w in text.split()]}

    def _id(self, word):
        if word not in self.ids:
            self.ids[word] = len(self.words)
            self.words.append(word)
        return self.ids[word]

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


class WordLoad:
    """Arrivals and prompts, and the tokens-per-word ratio that sizes them. Any thread."""

    def __init__(self):
        self._gen = LoadGenerator(WordTokenizer())
        self._lock = threading.Lock()
        self._words_sent = 0
        self._tokens_reported = 0

    def prompt(self, n_tokens):
        """(text of about `n_tokens` of the server's tokens, (its words, its estimated tokens))."""
        with self._lock:
            ratio = self._tokens_reported / self._words_sent if self._tokens_reported else 1.0
            words = max(1, round(n_tokens / ratio))
            return self._gen.prompt(words), (words, round(words * ratio))

    def reported(self, words, tokens):
        """The server counted `tokens` prompt tokens in a prompt of `words` words."""
        with self._lock:
            self._words_sent += words
            self._tokens_reported += tokens

    def due(self, now, on, rate):
        """How many arrivals are due by `now`, and when the next one is (None when off)."""
        with self._lock:
            return self._gen.due(now, on, rate), self._gen.next_arrival

    def restart(self):
        """Forget the scheduled arrival (the rate changed)."""
        with self._lock:
            self._gen.restart()
