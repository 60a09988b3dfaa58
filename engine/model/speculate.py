"""Proposers for speculative decoding: guesses of a request's next tokens without a second model.

A decode step of a small model is bound by reading its weights, so verifying a request's next
k+1 positions in one forward costs about what one position costs. A proposer guesses those
k tokens from text already seen; the engine's step verifies them (`sampler.verify`) and keeps
the run of guesses the model agrees with, plus one token of its own.

* `ngram` (vLLM's prompt lookup): the last n tokens (n from `prompt_lookup_max` down to
  `prompt_lookup_min`) are looked for earlier in this request's prompt and output; the tokens
  that followed the most recent earlier occurrence are the guesses.
* `suffix` (after vLLM's suffix decoding, Arctic Inference): counted tries of every substring
  of up to `DEPTH` tokens, one over this request's prompt and output and one over the outputs of
  recent earlier requests. The longest suffix of the context found with a continuation picks
  the node; the guesses follow its most frequent child while that child's share of the node's
  count stays at least `MIN_PROB`, and number at most `MAX_SPEC_FACTOR` x the match's length (a
  one-token match is weak evidence: guessing far past it mostly buys rejected positions, which
  a full batch pays for).

Both are deterministic functions of the tokens they have seen, so greedy output never depends
on them (only its speed does).
"""
from collections import deque

import numpy as np


PROMPT_LOOKUP_MIN, PROMPT_LOOKUP_MAX = 2, 5    # vLLM's ngram defaults are 1..(k); 2 avoids one-token flukes
DEPTH = 16           # longest substring a suffix trie holds
MIN_PROB = 0.1       # vLLM's suffix_decoding_min_token_prob
MAX_SPEC_FACTOR = 1.0   # vLLM's suffix_decoding_max_spec_factor: guesses <= factor x match length
CACHED_REQUESTS = 64  # earlier requests' outputs the global suffix trie remembers


def ngram_propose(tokens, k, lo=PROMPT_LOOKUP_MIN, hi=PROMPT_LOOKUP_MAX):
    """Up to `k` tokens that followed the most recent earlier occurrence of the longest suffix of
    `tokens` (between `lo` and `hi` tokens long); [] when there is none."""
    n_tok = len(tokens)
    if n_tok < lo + 1 or k <= 0:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    for n in range(min(hi, n_tok - 1), lo - 1, -1):
        # windows[i] == arr[i:i+n]; the last window is the suffix itself
        windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
        hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return arr[start:start + k].tolist()
    return []


class Trie:
    """Counted trie of every substring of up to DEPTH tokens of the sequences fed to it. A node is
    [count, children]; a sequence is fed token by token (`extend`), keeping its open paths."""

    def __init__(self):
        self.root = [0, {}]

    def new_cursor(self):
        return []     # the nodes of the suffixes ending at the last token fed, shortest first

    def extend(self, cursor, tokens, sign=1):
        """Feed `tokens` after those the cursor has seen (`sign` -1 takes them out again)."""
        for t in tokens:
            nxt = []
            for node in [self.root] + cursor[:DEPTH - 1]:
                child = node[1].get(t)
                if child is None:
                    child = node[1][t] = [0, {}]
                child[0] += sign
                if child[0] <= 0:
                    del node[1][t]
                nxt.append(child)
            cursor[:] = nxt
        return cursor

    def match(self, context):
        """(length, node): the longest suffix of `context` (up to DEPTH - 1) found with a
        continuation; (0, None) when none is."""
        best = (0, None)
        for n in range(1, min(DEPTH - 1, len(context)) + 1):
            node = self.root
            for t in context[-n:]:
                node = node[1].get(t)
                if node is None:
                    break
            if node is None:
                break       # a longer suffix contains this one: it cannot be found either
            if node[1]:
                best = (n, node)
        return best


def follow(node, k):
    """Up to `k` tokens down the most frequent children from `node`, each at least MIN_PROB of
    its parent's continuations."""
    out = []
    while node is not None and node[1] and len(out) < k:
        total = sum(c[0] for c in node[1].values())
        t, child = max(node[1].items(), key=lambda kv: (kv[1][0], -kv[0]))
        if child[0] < MIN_PROB * total:
            break
        out.append(t)
        node = child
    return out


def kinds(emitted, proposed):
    """What each of `emitted` tokens of one forward was, when `proposed` guesses were verified:
    "accepted" (a guess the model agreed with), then "corrected" (the model's own token where it
    rejected a guess) or "bonus" (its token after accepting every guess); None for plain decodes."""
    if not proposed:
        return [None] * emitted
    return ["accepted"] * (emitted - 1) + ["bonus" if emitted - 1 == proposed else "corrected"]


class Speculator:
    """The proposer the engine's settings choose, and each request's state for it."""

    def __init__(self):
        self.method, self.k = "off", 4
        self.shared = Trie()                 # outputs of earlier requests (suffix)
        self._remembered = deque()           # (tokens) fed to `shared`, oldest first
        self._own = {}                       # request id -> (its Trie, cursor, tokens fed)

    def configure(self, method, k):
        self.method, self.k = method, k

    def settings_for(self, seq):
        """(method, k) for this request: its own override (SamplingParams), else the engine's."""
        p = seq.params
        return (p.speculation or self.method), (p.spec_tokens or self.k)

    def propose(self, seq, limit):
        """At most `limit` guesses of the request's next tokens (its own setting's k at most)."""
        method, k = self.settings_for(seq)
        k = min(k, limit)
        if method == "off" or k <= 0:
            return []
        tokens = seq.prompt_ids + seq.output_ids
        if method == "ngram":
            return ngram_propose(tokens, k)
        return self._suffix(seq, tokens, k)

    def _suffix(self, seq, tokens, k):
        own = self._own.get(seq.id)
        if own is None:
            trie = Trie()
            own = self._own[seq.id] = [trie, trie.new_cursor(), 0]
        trie, cursor, fed = own
        trie.extend(cursor, tokens[fed:])
        own[2] = len(tokens)
        length, node = max(trie.match(tokens), self.shared.match(tokens), key=lambda m: m[0])   # ties: its own
        return follow(node, min(k, int(MAX_SPEC_FACTOR * length)))

    def finished(self, seq):
        """The request is done: drop its own trie; a suffix request's output joins the shared one."""
        own = self._own.pop(seq.id, None)
        if own is None or not seq.output_ids:
            return
        self.shared.extend(self.shared.new_cursor(), seq.output_ids)
        self._remembered.append(list(seq.output_ids))
        while len(self._remembered) > CACHED_REQUESTS:
            self.shared.extend(self.shared.new_cursor(), self._remembered.popleft(), sign=-1)

    def forget(self):
        """Forget every earlier request's output (the engine's reset)."""
        self.shared, self._remembered = Trie(), deque()
