"""Incremental detokenisation and stop strings whose cost per token does not grow with the output.

Why this exists
---------------
The engine streams text token by token. The simple way to do that is to decode the *whole*
output again after every token and send what is new:

    full = tokenizer.decode(output_ids, skip_special_tokens=True)   # n tokens -> O(n)
    new, text = full[len(text):], full

and to look for stop strings with `any(s in text for s in stops)`, again over the whole text.
Each token then costs O(n), a request of n tokens O(n^2), and all of it runs on the engine
thread, between forward passes, for every running request.

Why not decode each token on its own? Because a token is not a piece of text:

* byte-level BPE tokens (GPT-2, SmolLM2, Llama 3, ...) are *bytes*; an emoji or a CJK character
  is often split over two to four tokens, and a token alone may decode to "\\ufffd" (the
  replacement character) until the rest of the character arrives;
* SentencePiece-style decoders (Metaspace, Strip) drop the leading space of the *first* token
  they are given, so a token decoded alone can lose its space.

So we decode a short window that starts a little *before* the new token (the "prefix", which
gives the decoder its context) and emit only the part after the prefix's text; while the
window's text ends in "\\ufffd" we emit nothing and wait for more tokens. The window only ever
starts at a token where the text was complete, so its text is exactly a suffix of the full
decode, and the concatenated pieces equal `tokenizer.decode(all_ids, skip_special_tokens=True)`
at every point where that decode does not end in a partial character (and after `flush()`,
always). This is the "prefix offset / read offset" method from vLLM.

Which implementation
--------------------
`tokenizers.decoders.DecodeStream` (tokenizers >= 0.21) is that very method, written in Rust
and driven with the fast tokenizer's backend (`tokenizer._tokenizer`). It was checked against
`decode` on the tiny test tokenizer and on SmolLM2's, on text with emoji, accents, CJK,
whitespace runs, EOS and other special tokens in the middle, and random id sequences (3,000 per
tokenizer when choosing; hundreds in tests/engine/test_detok.py): identical at every complete point.
A Python version of the same method (two `decode` calls on the window) gave the same pieces,
token for token, but cost ~1.5 us a token against ~0.6 us, so `Detokenizer` uses DecodeStream. Tokenizers without a Rust backend, or whose `decode` post-processes the
text (`clean_up_tokenization_spaces` on a non-BPE model), fall back to the old whole-output
decode: exact, but O(n) a token.

Measured on SmolLM2's tokenizer, 2 shared cores, microseconds per token averaged over an output
of n tokens of English text (the n-th token alone costs about twice the average the old way),
four stop strings (StopStrings.feed finds them and also works out the client's text, held-back
tail included; the whole-text check only finds them; 5 Dec 2026, two runs):

    n      whole-output decode   Detokenizer.add   whole-text stop check   StopStrings.feed
    64            ~8                   ~0.75               ~0.6                  ~1.4
    512           ~55-80               ~0.75               ~3                    ~1.3
    2048         ~225-410              ~0.75               ~10-14                ~1.3

(`python -m engine.core.detok` prints these figures again.)

Stop strings
------------
`StopStrings` is the whole stop rule (OpenAI's): it says when a stop string has appeared (the
request then stops) and which text the request's client gets: everything before the first stop
string, with a tail that might begin one held back until the next token decides (released when
the request ends otherwise). A stop string appearing for the first time must end inside the
new text, and its part before that was held back, so only the held tail plus the new text is
searched.
"""
import tokenizers
from tokenizers.decoders import DecodeStream

REPLACEMENT = "\ufffd"


def _backend(tokenizer):
    """The Rust `tokenizers.Tokenizer` behind a transformers fast tokenizer, or None if
    windowed decoding could differ from `tokenizer.decode` (no backend, or a text clean-up
    that transformers applies after the backend decodes)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if not isinstance(backend, tokenizers.Tokenizer):
        return None
    if getattr(tokenizer, "clean_up_tokenization_spaces", False):
        # transformers skips the clean-up for BPE models unless forced (tokenization_utils_tokenizers).
        forced = getattr(tokenizer, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",
                         False)
        if type(backend.model).__name__ != "BPE" or forced:
            return None
    return backend


class Detokenizer:
    """Turns one request's output ids into text, a token at a time.

        d = Detokenizer(tokenizer)
        piece = d.add(token_id)   # the text this token adds; "" while a character is incomplete
        d.text                    # all text so far (== "".join of every piece)
        d.flush()                 # at the end: what is still held back (a partial character)

    `"".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)` whenever that decode
    does not end in "\\ufffd", and always after `flush()`.
    """

    def __init__(self, tokenizer, skip_special_tokens=True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = []            # every id added (the fallback and flush() need them)
        self._parts = []         # emitted pieces; `text` joins them lazily
        self._text = ""
        self._backend = _backend(tokenizer)
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens) if self._backend else None
        # Mirror of the stream's window: ids[_start:_read] is the prefix whose text was already
        # emitted, ids[_read:] the tokens not yet turned into text.
        self._start = self._read = 0

    @property
    def streaming(self):
        """True when the O(1) DecodeStream path is used, False for the whole-output fallback."""
        return self._stream is not None

    @property
    def text(self):
        if self._parts:
            self._text += "".join(self._parts)
            self._parts.clear()
        return self._text

    def add(self, token_id):
        """Add one generated id; return the new text it completes ("" if none yet)."""
        self.ids.append(token_id)
        if self._stream is None:
            return self._add_full()
        try:
            piece = self._stream.step(self._backend, token_id)
        except Exception:  # e.g. DecodeStream's InvalidPrefix on an unusual decoder
            self._stream = None
            return self._add_full()
        if piece is None:
            return ""
        self._start, self._read = self._read, len(self.ids)
        self._parts.append(piece)
        return piece

    def flush(self):
        """The text still held back at the end (a partial character decodes to "\\ufffd"), so
        that `text` then equals `decode(ids)` exactly. Call once, when the request ends."""
        if self._stream is None:
            piece = self._decode(self.ids)[len(self.text):]
        else:
            window = self._decode(self.ids[self._start:])
            piece = window[len(self._decode(self.ids[self._start:self._read])):]
            self._start = self._read = len(self.ids)
            self._stream = DecodeStream(skip_special_tokens=self.skip_special_tokens)
        if piece:
            self._parts.append(piece)
        return piece

    def _decode(self, ids):
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _add_full(self):
        full = self._decode(self.ids)
        if full.endswith(REPLACEMENT):
            return ""
        piece = full[len(self.text):]
        if piece:
            self._parts.append(piece)
        return piece


class Pieces:
    """Each token id's own text, decoded alone and remembered (the candidates a token event names,
    the API's logprob tokens): a vocabulary's ids are few, and the same ones come back all the time.
    A byte-level token that is part of a character decodes to "\ufffd", as vLLM's logprob tokens do."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._text = {}

    def __call__(self, token_id):
        text = self._text.get(token_id)
        if text is None:
            text = self._text[token_id] = self.tokenizer.decode([token_id])
        return text

    def odds(self, token_id, chance):
        """Token `token_id`'s `sampler.Chance` as its `token` event's fields, each candidate with
        its text ({} without odds)."""
        if chance is None:
            return {}
        name = lambda c: (c[0], self(c[0]), c[1], c[2])   # noqa: E731
        return dict(p=chance.p, p_raw=chance.p_raw, top=[name(c) for c in chance.top],
                    rejected=chance.rejected and name(chance.rejected), own_text=self(token_id))


class StopStrings:
    """OpenAI's stop rule for one request's streamed text, the one place it is applied: the text
    its client gets ends just before the first stop string, and text that might be the start of
    one is held back until later text decides.

        stops = StopStrings(["\\n\\n", "User:"])
        out = stops.feed(piece)   # the text the client may have now ("" while it could begin a stop)
        stops.found               # a stop string has appeared (sticky): the request stops
        out = stops.flush()       # at the end: what was held back ("" once a stop string appeared)

    Only `held + piece` is searched: a stop string appearing for the first time ends inside
    the new piece, and whatever of it came before is a tail that begins a stop string, so it
    was held back. `found` turns true at the same piece as `any(s in text for s in stops)`
    over the whole text would.
    """

    def __init__(self, stops):
        self.stops = tuple(s for s in stops if s)
        self.held = ""      # the tail of the text fed that begins some stop string: not yet given out
        self.found = False
        # Each stop string's proper prefix lengths by the prefix's last character, longest first:
        # a tail of the text can begin a stop string only with a prefix ending in its last character.
        self._prefixes = [(s, {c: [k for k in range(len(s) - 1, 0, -1) if s[k - 1] == c] for c in set(s[:-1])})
                          for s in self.stops]

    def feed(self, piece):
        if self.found:
            return ""
        if not self.stops:
            return piece
        window = self.held + piece
        hits = [i for i in (window.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.found, self.held = True, ""
            return window[:min(hits)]
        cut = len(window) - self._partial(window)
        self.held = window[cut:]
        return window[:cut]

    def flush(self):
        out, self.held = ("" if self.found else self.held), ""
        return out

    def _partial(self, window):
        """The length of the longest tail of `window` that begins some stop string."""
        best = 0
        if not window:
            return best
        for s, by_last in self._prefixes:
            for k in by_last.get(window[-1], ()):
                if k <= best:
                    break
                if k <= len(window) and window.endswith(s[:k]):
                    best = k
                    break
        return best


def _measure(lengths=(64, 512, 2048), stops=("\n\nUser:", "</s>", "###", "THE END")):
    """Per-token cost, old way vs this module, on the default model's tokenizer (prints a table)."""
    tok, ids = _corpus_ids(max(lengths))
    print(f"{'n':>6} {'old decode':>11} {'Detokenizer':>12} {'old stop':>9} {'StopStrings':>12}  (us per token)")
    for n in lengths:
        window = ids[:n]
        d = Detokenizer(tok)
        pieces = [d.add(t) for t in window]
        ways = (lambda: _old_decode(tok, window), lambda: _new_decode(tok, window),
                lambda: _old_stop(pieces, stops), lambda: _new_stop(pieces, stops))
        old_d, new_d, old_s, new_s = (_us_per_token(way, n) for way in ways)
        print(f"{n:>6} {old_d:>11.2f} {new_d:>12.2f} {old_s:>9.2f} {new_s:>12.2f}")


def _corpus_ids(n):
    """The default model's tokenizer and at least `n` ids of the shipped corpus."""
    from transformers import AutoTokenizer
    from engine.model import loading
    from engine.teach.loadgen import CORPUS
    directory = loading._gguf_cache_dir(loading.default_model_path())
    if not directory.exists():
        loading.load()
    tok = AutoTokenizer.from_pretrained(directory)
    return tok, tok(CORPUS.read_text() * (n // 1000 + 2), add_special_tokens=False)["input_ids"]


def _old_decode(tok, ids):
    """The whole output decoded again after every token."""
    text = ""
    for i in range(1, len(ids) + 1):
        full = tok.decode(ids[:i], skip_special_tokens=True)
        if not full.endswith(REPLACEMENT):
            full[len(text):]   # the new piece, as the old way sent it (its cost counts)
            text = full


def _new_decode(tok, ids):
    d = Detokenizer(tok)
    for t in ids:
        d.add(t)


def _old_stop(pieces, stops):
    """Every stop string searched for in the whole text after every piece."""
    text = ""
    for p in pieces:
        text += p
        any(s in text for s in stops)


def _new_stop(pieces, stops):
    s = StopStrings(stops)
    for p in pieces:
        s.feed(p)


def _us_per_token(way, n):
    """Best of a few runs of `way()` (over `n` tokens), in microseconds per token."""
    import time
    best = float("inf")
    for _ in range(3 if n > 1000 else 7):
        t0 = time.perf_counter()
        way()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


if __name__ == "__main__":
    _measure()
