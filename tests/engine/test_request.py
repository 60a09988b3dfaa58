"""The one typed request (engine/core/request.py): every bad field is refused as the request is
built, naming the field; what only the engine can judge is refused by `submit`; either way
nothing is queued and no slot or block is taken. Defaults come from the live settings."""
import pytest

from engine import Engine, EngineConfig, GenerateRequest, SettingError
from engine import events as ev
from engine.core.request import MAX_LABEL_CHARS, MAX_PROMPT_CHARS

BAD = [  # (fields, the field named)
    (dict(), "prompt"), (dict(prompt=""), "prompt"), (dict(prompt=5), "prompt"),
    (dict(prompt="x" * (MAX_PROMPT_CHARS + 1)), "prompt"),
    (dict(prompt="hi", messages=[{"role": "user", "content": "hi"}]), "prompt"),
    (dict(messages=[]), "messages"), (dict(messages="hi"), "messages"),
    (dict(messages=[{"role": "user"}]), "messages"), (dict(messages=[{"role": "user", "content": 3}]), "messages"),
    (dict(prompt="hi", chat="yes"), "chat"),
    (dict(prompt="hi", max_new_tokens=0), "max_new_tokens"), (dict(prompt="hi", max_new_tokens=2.5), "max_new_tokens"),
    (dict(prompt="hi", max_new_tokens="8"), "max_new_tokens"), (dict(prompt="hi", max_new_tokens=True), "max_new_tokens"),
    (dict(prompt="hi", temperature=-0.1), "temperature"), (dict(prompt="hi", temperature=2.5), "temperature"),
    (dict(prompt="hi", temperature=float("nan")), "temperature"),
    (dict(prompt="hi", top_p=0), "top_p"), (dict(prompt="hi", top_p=1.5), "top_p"),
    (dict(prompt="hi", seed=-1), "seed"), (dict(prompt="hi", seed=2**63), "seed"), (dict(prompt="hi", seed="7"), "seed"),
    (dict(prompt="hi", stop="END"), "stop"), (dict(prompt="hi", stop=["a", "b", "c", "d", "e"]), "stop"),
    (dict(prompt="hi", stop=[""]), "stop"), (dict(prompt="hi", stop=[1]), "stop"), (dict(prompt="hi", stop=["\x00"]), "stop"),
    (dict(prompt="hi", ignore_eos=1), "ignore_eos"),
    (dict(prompt="hi", min_tokens=-1), "min_tokens"), (dict(prompt="hi", min_tokens=1.5), "min_tokens"),
    (dict(prompt="hi", label=""), "label"), (dict(prompt="hi", label=5), "label"),
    (dict(prompt="hi", label="x" * (MAX_LABEL_CHARS + 1)), "label"), (dict(prompt="hi", label="a\ud800"), "label"),
    (dict(prompt="hi", source="web"), "source"), (dict(prompt="hi", stream="no"), "stream"),
    (dict(prompt="hi", prompt_tokens=0), "prompt_tokens"),
    (dict(prompt="hi", speculative_config={}), "speculative_config"),
    (dict(prompt="hi", speculative_config={"method": "eagle"}), "speculative_config"),
    (dict(prompt="hi", speculative_config={"num_speculative_tokens": 9}), "speculative_config"),
    (dict(prompt="hi", speculative_config={"method": "ngram", "draft_model": "x"}), "speculative_config"),
    (dict(prompt="hi", priority="high"), "priority"), (dict(prompt="hi", priority=1.5), "priority"),
    (dict(prompt="hi", priority=2**31), "priority"), (dict(prompt="hi", priority=None), "priority"),
    (dict(prompt="hi", add_special_tokens=1), "add_special_tokens"),
]


@pytest.mark.parametrize("fields, field", BAD)
def test_a_bad_field_is_refused_as_the_request_is_built(fields, field):
    with pytest.raises(SettingError) as e:
        GenerateRequest(**fields)
    assert e.value.field == field and e.value.message


def test_values_are_normalised():
    r = GenerateRequest(prompt="hi", max_new_tokens=8.0, temperature=1, stop=["a", "b"], seed=3.0)
    assert (r.max_new_tokens, r.temperature, r.stop, r.seed) == (8, 1.0, ("a", "b"), 3)
    assert type(r.max_new_tokens) is int and type(r.temperature) is float
    r = GenerateRequest(prompt="hi", speculative_config={"num_speculative_tokens": 3.0})
    assert r.speculative_config == {"method": None, "num_speculative_tokens": 3}
    r = GenerateRequest(prompt="hi", priority=-3.0)
    assert r.priority == -3 and type(r.priority) is int and GenerateRequest(prompt="hi").priority == 0


pytestmark = pytest.mark.driver(slots=2, kv_tokens=1024, max_context=256, start=False)   # what it queues stays


@pytest.mark.parametrize("fields, field", [
    (dict(prompt="hi", max_new_tokens=257), "max_new_tokens"),        # beyond the context
    (dict(prompt="hi", max_new_tokens=3, min_tokens=4), "min_tokens"),
    (dict(prompt="hi", min_tokens=65), "min_tokens"),                 # above the setting's max_new_tokens (64)
    (dict(prompt="a\x00b"), "prompt"), (dict(prompt="a\ud800"), "prompt"),
    (dict(messages=[{"role": "user", "content": "x\x00"}]), "prompt"),   # the templated text
])
def test_what_only_the_engine_judges_is_refused_by_submit_and_nothing_is_queued(driver, fields, field):
    eng = driver.engine
    with pytest.raises(SettingError) as e:
        driver.submit(GenerateRequest(**fields))
    assert e.value.field == field
    assert driver._inbox.empty() and eng.in_flight == 0 and eng.blocks.used == 0
    assert not eng.scheduler.waiting and not eng.scheduler.running


def test_a_requests_priority_is_its_own_on_the_engine(driver):
    seq = driver.engine.new_sequence(GenerateRequest(prompt="hi", priority=7))
    assert seq.params.priority == 7


def test_defaults_come_from_the_live_settings_when_the_engine_takes_it(driver):
    eng = driver.engine
    eng.apply_settings({"max_new_tokens": 7, "temperature": 0.5, "top_p": 0.9})
    p = eng.new_sequence(GenerateRequest(prompt="We hold these truths")).params
    assert (p.max_new_tokens, p.temperature, p.top_p) == (7, 0.5, 0.9)
    p = eng.new_sequence(GenerateRequest(prompt="We hold", max_new_tokens=3, temperature=0.0, top_p=1.0)).params
    assert (p.max_new_tokens, p.temperature, p.top_p) == (3, 0.0, 1.0)


def test_the_load_generator_cuts_its_prompt_to_length(driver):
    seq = driver.engine.new_sequence(GenerateRequest(prompt="We hold these truths to be self-evident",
                                                     source="load", prompt_tokens=3))
    assert len(seq.prompt_ids) == 3 and seq.source == "load"


def test_observe_mode_takes_the_pages_and_students_fields_only():
    """A prompt and the request registry's fields (tests/engine/test_fields.py: each is sent)."""
    from observe import Observer
    obs = Observer("http://127.0.0.1:9/v1")   # never started: nothing is sent
    for fields, field in ((dict(prompt="hi", stop=["x"]), "stop"), (dict(prompt="hi", prompt_tokens=4), "prompt_tokens"),
                          (dict(messages=[{"role": "user", "content": "hi"}]), "messages")):
        with pytest.raises(SettingError) as e:
            obs.submit(GenerateRequest(**fields))
        assert e.value.field == field
    with pytest.raises(SettingError) as e:   # this mode's own bounds (the page's slider)
        obs.submit(GenerateRequest(prompt="hi", max_new_tokens=513))
    assert e.value.field == "max_new_tokens"
    assert obs.flights.sent() == {}   # nothing in flight


def test_the_handle_carries_the_very_events_the_engine_emits(tiny):
    """One output path: a streaming request's handle holds its `token` events then its
    `finished` (the same objects the engine returns for pages, in order); a refused one holds
    its one `rejected`; `next` gives None when nothing comes in time."""
    eng = Engine(tiny, EngineConfig(slots=2, kv_tokens=1024, max_context=256))
    seq = eng.new_sequence(GenerateRequest(prompt="We hold these truths", max_new_tokens=4, stream=True))
    handle, out = seq.handle, eng.add(seq)
    assert handle.next(timeout=0) is None and not handle.ended
    while eng.scheduler.running or eng.scheduler.waiting:
        out += eng.step()
    mine = [e for e in out if isinstance(e, (ev.Token, ev.Finished)) and e.id == seq.id]
    got = list(handle)
    assert len(got) == len(mine) >= 2 and all(a is b for a, b in zip(got, mine)) and handle.ended
    assert isinstance(got[-1], ev.Finished) and list(handle) == []
    big = eng.new_sequence(GenerateRequest(prompt="truths " * 300, max_new_tokens=4, stream=True))
    (rejected,) = [e for e in eng.add(big) if isinstance(e, ev.Rejected)]
    assert list(big.handle) == [rejected] and rejected.code == "context_length_exceeded"
    quiet = eng.new_sequence(GenerateRequest(prompt="We hold", max_new_tokens=2))   # not streaming: nothing kept
    eng.add(quiet)
    assert quiet.handle._events is None


@pytest.fixture(scope="module")
def bos():
    """The tiny model with a tokenizer that adds `<bos>` in front of a text (as Gemma's and Llama's do)."""
    from helpers import tiny_bundle
    return tiny_bundle(bos=True)


def test_a_prompt_gets_the_tokenizers_own_special_tokens_and_a_chat_its_templates_alone(bos):
    """vLLM's defaults: a completion's prompt tokenized with the tokenizer's special tokens (its BOS
    first), a chat's templated text without a second one; `add_special_tokens` says otherwise."""
    from helpers import engine_driver
    tok = bos.tokenizer
    plain = tok("We hold these truths", add_special_tokens=False).input_ids
    d = engine_driver(bos, start=False)
    try:
        new = lambda **f: d.engine.new_sequence(GenerateRequest(**f)).prompt_ids   # noqa: E731
        assert new(prompt="We hold these truths") == [tok.bos_token_id] + plain
        assert new(prompt="We hold these truths", add_special_tokens=False) == plain
        chat = [{"role": "user", "content": "We hold these truths"}]
        templated = tok(tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False).input_ids
        assert tok.bos_token_id not in templated
        assert new(messages=chat) == new(prompt="We hold these truths", chat=True) == templated
        assert new(messages=chat, add_special_tokens=True) == [tok.bos_token_id] + templated
        assert new(prompt="We hold these truths", source="load", prompt_tokens=2) == [tok.bos_token_id] + plain[:1]
    finally:
        d.shutdown()


def test_a_tokenizer_without_special_tokens_tokenizes_as_before(driver, tiny):
    """The tiny tokenizer adds nothing (as SmolLM2's): a prompt's ids are its text's, either way."""
    ids = tiny.tokenizer("We hold these truths", add_special_tokens=False).input_ids
    for special in (None, True, False):
        assert driver.engine.new_sequence(GenerateRequest(prompt="We hold these truths",
                                                          add_special_tokens=special)).prompt_ids == ids


def test_a_chat_to_a_model_without_a_template_is_refused_naming_it_and_a_prompt_still_runs():
    from helpers import engine_driver, tiny_bundle
    bare = tiny_bundle(chat_template=None)
    d = engine_driver(bare, start=False)
    try:
        with pytest.raises(SettingError) as e:
            d.submit(GenerateRequest(messages=[{"role": "user", "content": "hi"}]))
        assert e.value.field == "chat_template" and "no chat template" in e.value.message
        assert d._inbox.empty() and d.engine.in_flight == 0
        # the page's prompt (chat=True by default) is the plain text where there is no template
        ids = bare.tokenizer("hi there", add_special_tokens=False).input_ids
        assert d.engine.new_sequence(GenerateRequest(prompt="hi there", chat=True)).prompt_ids == ids
    finally:
        d.shutdown()
