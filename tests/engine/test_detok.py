"""engine.core.detok: incremental detokenisation equals a whole decode; stop strings found on the tail only."""
import random

import pytest
from tokenizers import Tokenizer, decoders

from helpers import tiny_tokenizer
from engine.model import loading as model_mod
from engine.core.detok import Detokenizer, StopStrings
from engine.teach.loadgen import CORPUS

TEXTS = [
    "Héllo wörld! naïve café, crème brûlée, Ærøskøbing, ß ẞ",
    "😀👍🏽🇫🇷🧑‍🤝‍🧑 emoji with skin tones, flags and ZWJ sequences 🎉🎉",
    "日本語のテキスト、中文文本，한국어 텍스트 ∑∫√∞ ≠ ≤",
    "whitespace   runs\n\n\n\ttabs\t\t and  trailing   \n  ",
    "mixed: a😀b é\u0301 (combining) — “quotes” «guillemets» ½ € ¥ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
]


@pytest.fixture(scope="session")
def tiny_tok():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def real_tok():
    """SmolLM2's tokenizer alone, from the weight cache (a model.load() fills it on first use)."""
    from transformers import AutoTokenizer
    directory = model_mod._gguf_cache_dir(model_mod.default_model_path())
    if not directory.exists():
        model_mod.load()
    return AutoTokenizer.from_pretrained(directory)


@pytest.fixture(params=["tiny", pytest.param("real", marks=pytest.mark.real_model)])
def tok(request):
    return request.getfixturevalue(f"{request.param}_tok")


def decode(tok, ids):
    return tok.decode(ids, skip_special_tokens=True)


def id_cases(tok, seed=0, n_random=150):
    """Nice text, text with special tokens spliced in, shuffled multi-byte tokens, random ids."""
    rng = random.Random(seed)
    specials = sorted(set(tok.all_special_ids))
    cases = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        cases.append(ids)
        spliced = list(ids)
        for _ in range(3):   # EOS and other specials anywhere, also inside a split character
            spliced.insert(rng.randrange(len(spliced) + 1), rng.choice(specials))
        cases.append(spliced + [tok.eos_token_id])
    multibyte = [i for t in TEXTS for i in tok.encode(t, add_special_tokens=False)]
    for _ in range(n_random):   # pieces of multi-byte characters in any order: partial UTF-8
        cases.append([rng.choice(multibyte) for _ in range(rng.randrange(1, 40))])
    for _ in range(n_random):   # any ids at all, specials included
        cases.append([rng.randrange(len(tok)) for _ in range(rng.randrange(1, 60))])
    return cases


def stream(tok, ids):
    """Feed ids one by one; check the text against a whole decode at every step."""
    d = Detokenizer(tok)
    assert d.streaming
    pieces = []
    for k in range(1, len(ids) + 1):
        piece = d.add(ids[k - 1])
        pieces.append(piece)
        want = decode(tok, ids[:k])
        assert d.text == "".join(pieces)
        if want.endswith("\ufffd"):
            assert want.startswith(d.text)     # held back, never wrong
        else:
            assert d.text == want, (ids[:k], d.text, want)
    return d, pieces


def test_equals_whole_decode_at_every_complete_point(tok):
    for ids in id_cases(tok):
        d, _ = stream(tok, ids)
        d.flush()
        assert d.text == decode(tok, ids)


def test_nice_text_round_trips_and_pieces_have_no_replacement_char(tok):
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        d, pieces = stream(tok, ids)
        assert d.text == text
        assert not any("\ufffd" in p for p in pieces)
        assert d.flush() == ""


def test_replacement_char_only_where_the_complete_decode_has_one(tok):
    """A piece may carry "\\ufffd" only for bytes that stay invalid: every piece sits in the final
    decode at its place, so none is a character that later tokens would have completed."""
    seen_split = 0
    for ids in id_cases(tok, seed=1):
        final = decode(tok, ids)
        d = Detokenizer(tok)
        at = 0
        for k, t in enumerate(ids, 1):
            piece = d.add(t)
            assert final[at:at + len(piece)] == piece
            at += len(piece)
            seen_split += decode(tok, ids[:k]).endswith("\ufffd") and not final.endswith("\ufffd")
    assert seen_split > 0   # the cases really do split characters across tokens


def test_split_character_is_held_then_released(tok):
    ids = tok.encode("a😀b", add_special_tokens=False)
    d = Detokenizer(tok)
    pieces = [d.add(t) for t in ids]
    assert "".join(pieces) == "a😀b"
    assert "" in pieces      # the emoji spans several byte tokens: nothing until it is complete
    assert not any("\ufffd" in p for p in pieces)


def test_flush_releases_a_trailing_partial_character(tok):
    ids = tok.encode("ok 😀", add_special_tokens=False)
    cut = next(k for k in range(len(ids)) if decode(tok, ids[:k]).endswith("\ufffd"))
    d = Detokenizer(tok)
    for t in ids[:cut]:
        d.add(t)
    held = decode(tok, ids[:cut])
    assert held.startswith(d.text) and "\ufffd" not in d.text
    assert d.flush().endswith("\ufffd")
    assert d.text == decode(tok, ids[:cut])


def test_fallback_without_a_rust_backend_is_exact(tiny_tok):
    class Slow:   # a tokenizer with only decode(): the whole-output path
        def decode(self, ids, skip_special_tokens=False):
            return tiny_tok.decode(ids, skip_special_tokens=skip_special_tokens)
    for ids in id_cases(tiny_tok, seed=2, n_random=30):
        d = Detokenizer(Slow())
        assert not d.streaming
        for k, t in enumerate(ids, 1):
            d.add(t)
            want = decode(tiny_tok, ids[:k])
            if not want.endswith("\ufffd"):
                assert d.text == want
        d.flush()
        assert d.text == decode(tiny_tok, ids)


class CountingTokenizer:
    """The tokenizer's Rust backend with a Python decoder that records how many tokens each
    decode is given: the window DecodeStream (or any implementation) actually decodes."""

    def __init__(self, tok):
        self.tok = tok
        self._tokenizer = Tokenizer.from_str(tok.backend_tokenizer.to_str())
        inner, self.sizes = decoders.ByteLevel(), []

        class Counting:
            def decode_chain(_, tokens):
                self.sizes.append(len(tokens))
                return [inner.decode(tokens)]
        self._tokenizer.decoder = decoders.Decoder.custom(Counting())

    def decode(self, ids, skip_special_tokens=False):
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_tokens_decoded_per_add_stay_bounded(tok):
    """Not a timing: the number of tokens handed to the decoder per add() does not grow with the
    output (a whole-output decode would hand it k tokens at the k-th add). The same block of ids
    three times over: its third copy costs exactly what its first did."""
    counting = CountingTokenizer(tok)
    block = tok.encode(CORPUS.read_text() + "".join(TEXTS), add_special_tokens=False)
    ids = block * 3
    d = Detokenizer(counting)
    assert d.streaming
    per_add = []
    for t in ids:
        counting.sizes.clear()
        d.add(t)
        per_add.append(sum(counting.sizes))
    assert d.text == decode(tok, ids)
    n = len(block)
    assert per_add[2 * n + 5:] == per_add[5:n]         # position in the output does not matter
    assert max(per_add) <= 16                          # a window of a few tokens, decoded twice
    assert sum(per_add) <= 4 * len(ids)                # linear in total, not quadratic


# Stop strings

def naive(text, stops):
    return any(s in text for s in stops)


def test_stop_string_split_across_tokens(real_tok):
    text = "Sure. Here is the answer.\n\nUser: thanks"
    ids = real_tok.encode(text, add_special_tokens=False)
    split = 0
    for stop in ["\n\nUser:", "answer.\n", "e is th", "User"]:
        d, stops, hits, out = Detokenizer(real_tok), StopStrings([stop]), [], ""
        for t in ids:
            out += stops.feed(d.add(t))
            hits.append(stops.found)
        k = hits.index(True)      # found at exactly the token that completes it
        assert stop in decode(real_tok, ids[:k + 1]) and stop not in decode(real_tok, ids[:k])
        assert all(hits[k:]) and out == text[:text.find(stop)]
        split += stop not in decode(real_tok, ids[k:k + 1])
    assert split >= 3             # most of them span two or more tokens


def test_stop_string_absent_is_never_found(tok):
    for text in TEXTS:
        d, stops = Detokenizer(tok), StopStrings(["\n\nUser:", "###", "zzz"])
        out = "".join(stops.feed(d.add(t)) for t in tok.encode(text, add_special_tokens=False))
        assert not stops.found and out + stops.flush() == d.text
    none = StopStrings([])
    assert none.feed("anything") == "anything" and not none.found


def openai_text(text, stops):
    """What OpenAI's rule gives a client of `text` so far, the whole text searched: everything
    before the first stop string; without one, all but the longest tail that begins a stop
    string (it might become one)."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    if hits:
        return text[:min(hits)]
    tail = max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
    return text[:len(text) - tail]


def test_stop_strings_match_whole_text_checks_on_random_cases():
    """Random short pieces over a tiny alphabet (so stops occur, often across pieces): after
    every piece, `found` agrees with the whole-text check (so it turns at exactly the piece that
    completes the first stop string) and the text given out so far is OpenAI's for the text so
    far; `flush` at the end gives out the rest."""
    rng = random.Random(0)
    for _ in range(3000):
        stops = ["".join(rng.choice("abc") for _ in range(rng.randrange(1, 6))) for _ in range(rng.randrange(1, 4))]
        s, text, out, want = StopStrings(stops), "", "", ""
        for _ in range(rng.randrange(1, 30)):
            piece = "".join(rng.choice("abcd") for _ in range(rng.randrange(0, 4)))
            text += piece
            if not s.found:       # once one appeared the request stops: later text is never given out
                want = openai_text(text, stops)
            out += s.feed(piece)
            assert s.found == naive(text, stops) and out == want, (stops, text)
            assert len(s.held) <= max(map(len, stops)) - 1
        assert out + s.flush() == (want if s.found else text)


def test_stop_strings_hold_back_a_possible_start():
    s = StopStrings(["END"])
    assert [s.feed(p) for p in ("ab", "cE", "N", "x")] == ["ab", "c", "", "ENx"] and s.flush() == ""
    s = StopStrings(["END", "b"])
    assert [s.feed(p) for p in ("aE", "NDc")] == ["a", ""] and s.found and s.flush() == ""
    s = StopStrings(["stop"])
    assert s.feed("hello st") == "hello " and not s.found and s.flush() == "st"
    s = StopStrings(["abcd", "c"])     # the earliest start wins, whichever string it is
    assert s.feed("xxabcd") == "xx" and s.feed("more") == ""


def test_stop_strings_on_detokenized_random_ids(tok):
    """Through the Detokenizer on random ids: stops taken from the text itself, found at the
    same token as the whole-text check."""
    rng = random.Random(3)
    for ids in id_cases(tok, seed=3, n_random=60):
        full = decode(tok, ids)
        if len(full) < 2:
            continue
        a = rng.randrange(len(full) - 1)
        stops = [full[a:a + rng.randrange(1, 8)], "never-there\x00"]
        d, s = Detokenizer(tok), StopStrings(stops)
        for t in ids:
            s.feed(d.add(t))
            assert s.found == naive(d.text, stops)
        s.feed(d.flush())
        assert s.found
