"""Prefill/decode disaggregation (engine/disagg/): two engines with their roles, the KV copy
between them, the accounting, and cancels at every stage. In-process first (both engines
stepped by hand, the coordinator's routing done by the test), then through the real
two-process backend."""
import pytest
import torch

from engine import EngineConfig, GenerateRequest
from engine import events as ev
from engine.disagg.messages import HandOff, Release
from engine.core.sequence import Status
from engine.settings import validate
from helpers import tiny_bundle   # noqa: F401 -- the child processes' factory lives there too
from stepping import Pair as Engines, assert_clean

LONG = ("When in the Course of human events, it becomes necessary for one people to dissolve the "
        "political bands which have connected them with another, and to assume among the powers of the earth")
BS = 16


def config(**kw):
    return EngineConfig(**{"slots": 4, "kv_tokens": 2048, "block_size": BS, "max_context": 512, **kw})


def Pair(bundle, prefill=None, decode=None):
    return Engines(bundle, prefill or config(), decode or config(), prompt=LONG)


def reference_ids(bundle, ids, max_new):
    t = torch.tensor([ids])
    out = bundle.model.generate(t, attention_mask=torch.ones_like(t), max_new_tokens=max_new, do_sample=False)
    return out[0, len(ids):].tolist()


@pytest.fixture(scope="module")
def pair(tiny):
    return Pair(tiny, prefill=config(), decode=config())


@pytest.mark.parametrize("n", [1, 2, BS, 2 * BS, 37])
def test_greedy_equals_generate(tiny, pair, n):
    """Prompts of 1 token, a block's worth, two blocks, and more: the decode instance's output
    equals generate's, and the prefill instance never samples."""
    rid = pair.add(prompt_tokens=n, max_new_tokens=8, ignore_eos=True)
    pair.until_idle()
    ids = tiny.tokenizer(LONG, add_special_tokens=False)["input_ids"][:n]
    assert pair.tokens(rid) == reference_ids(tiny, ids, 8)
    (fin,) = pair.of(ev.Finished, rid)
    assert fin.reason == "length" and fin.output_tokens == 8
    (moved,) = pair.of(ev.KVTransfer, rid)
    assert moved.tokens == n - 1 and moved.bytes == (n - 1) * pair.d.bytes_per_token
    assert {e.instance for e in pair.of(ev.Prefill, rid)} == {"prefill", "decode"}
    (last,) = [e for e in pair.of(ev.Prefill, rid) if e.instance == "decode"]
    assert (last.pos, last.tokens, last.done) == (n - 1, 1, True)   # the one-position recompute
    (admitted,) = [e for e in pair.of(ev.Admitted, rid) if e.instance == "decode"]
    assert admitted.cached_tokens == n - 1 and admitted.prompt_tokens == n
    assert_clean(pair.p, pair.d)


def test_chunked_prompts_and_several_at_once(tiny):
    """A 16-token budget on the prefill instance chunks every prompt; three requests overlap."""
    pair = Pair(tiny)
    pair.p.apply_settings(validate(pair.p.specs, {"max_batched_tokens": 16}))
    ids = tiny.tokenizer(LONG, add_special_tokens=False)["input_ids"]
    rids = [pair.add(prompt_tokens=n, max_new_tokens=6, ignore_eos=True) for n in (40, 17, 33)]
    pair.until_idle()
    for rid, n in zip(rids, (40, 17, 33)):
        assert pair.tokens(rid) == reference_ids(tiny, ids[:n], 6)
        chunks = [e for e in pair.of(ev.Prefill, rid) if e.instance == "prefill"]
        assert chunks[-1].done and not any(c.done for c in chunks[:-1])
    assert len([e for e in pair.of(ev.Prefill, rids[0]) if e.instance == "prefill"]) == 3   # 16 + 16 + 8
    assert_clean(pair.p, pair.d)


def test_decode_blocks_equal_prefill_blocks_element_for_element(tiny):
    """Right after the copy, positions 0..p-2 of every layer's K and V in the decode instance's
    blocks equal the prefill instance's, element for element."""
    pair = Pair(tiny)
    rid = pair.add(prompt_tokens=2 * BS + 5, max_new_tokens=4)
    for _ in range(50):
        pair.step()
        if pair.of(ev.KVTransfer, rid):
            break
    (moved,) = pair.of(ev.KVTransfer, rid)
    p = 2 * BS + 5
    assert moved.tokens == p - 1 and len(moved.src_blocks) == len(moved.dst_blocks) == 3
    for src, dst in ((pair.p.store.k, pair.d.store.k), (pair.p.store.v, pair.d.store.v)):
        for s, d in zip(src, dst):
            a = s[moved.src_blocks].reshape(-1, *s.shape[2:])[:p - 1]
            b = d[moved.dst_blocks].reshape(-1, *d.shape[2:])[:p - 1]
            assert a.abs().sum() > 0 and torch.equal(a, b)
    pair.until_idle()
    assert_clean(pair.p, pair.d)


def test_stages_add_up_and_transfer_is_the_copy(tiny):
    pair = Pair(tiny)
    rid = pair.add(prompt_tokens=40, max_new_tokens=5, ignore_eos=True)
    pair.until_idle()
    (fin,) = pair.of(ev.Finished, rid)
    (moved,) = pair.of(ev.KVTransfer, rid)
    assert sum(fin.stages.values()) == pytest.approx(fin.ttft, abs=1e-9)
    assert fin.stages["transfer"] == pytest.approx(moved.end - moved.start) and fin.stages["transfer"] > 0
    assert all(v >= 0 for k, v in fin.stages.items() if k != "other"), fin.stages
    prefill = sum(e.end - e.start for e in pair.of(ev.Prefill, rid))
    assert fin.stages["prefill"] == pytest.approx(prefill)      # the prefill forwards and the recompute
    admitted = pair.of(ev.Admitted, rid)
    assert [a.instance for a in admitted] == ["prefill", "decode"] and not any(a.resumed for a in admitted)
    assert {s.instance for s in pair.events if isinstance(s, ev.Step)} == {"prefill", "decode"}
    assert fin.later is not None and fin.later["stalled"] == 0


def test_a_stream_on_the_decode_instance_is_never_stalled_and_mixed_only_with_one_position_recomputes(tiny):
    """The decode instance runs no prompt chunks: a stream there shares forwards only with other
    requests' one-position recomputes (a `mixed` step of one prompt token each), never waits
    outside a forward for a prompt."""
    pair = Pair(tiny)
    a = pair.add(prompt_tokens=10, max_new_tokens=30, ignore_eos=True)
    while not pair.tokens(a):
        pair.step()
    b = pair.add(prompt_tokens=40, max_new_tokens=4, ignore_eos=True)
    pair.until_idle()
    decode_steps = [e for e in pair.of(ev.Step) if e.instance == "decode"]
    mixed = [e for e in decode_steps if e.kind == "mixed"]
    assert mixed and all(e.prefill_tokens == 1 for e in mixed) and any(set(e.ids) == {a, b} for e in mixed)
    assert all(e.prefill_tokens <= 1 for e in decode_steps)
    (fin,) = pair.of(ev.Finished, a)
    assert fin.later["mixed"] > 0 and fin.later["stalled"] == 0


def _stage(pair, rid, stage):
    """Bring request `rid` to `stage` (the pair stepped by hand)."""
    p, d = pair.p, pair.d
    if stage == "waiting-on-prefill":
        return
    if stage == "mid-prefill":
        pair.route(p.step())
        assert rid in p._by_id and p._by_id[rid].num_computed > 0
        return
    pair.hold = True
    while not pair.handoffs:
        pair.route(p.step())
    if stage == "handed-off":
        return
    pair.hold = False
    if stage == "waiting-for-remote-kv":   # the decode instance's only slot is taken
        pair.deliver()
        pair.route(d.step())
        assert d._by_id[rid].status is Status.WAITING and rid in d.connector.remote and rid in p.connector.held
        return
    pair.deliver()
    pair.route(d.step())
    if stage == "right-after-transfer":    # admitted, its keys and values copied in before the forward
        assert pair.of(ev.KVTransfer, rid) and d._by_id[rid].status is Status.RUNNING
        assert rid not in d.connector.remote and rid not in p.connector.held
        return
    while not pair.tokens(rid):
        pair.route(d.step())
    assert d._by_id[rid].status is Status.RUNNING      # "decoding"


STAGES = ["waiting-on-prefill", "mid-prefill", "handed-off", "waiting-for-remote-kv", "right-after-transfer",
          "decoding"]


@pytest.mark.parametrize("stage", STAGES)
def test_cancel_at_every_stage_leaks_nothing(tiny, stage):
    """Cancelled at each stage: one `finished` (cancelled), every block and slot back on both sides."""
    slots = 1 if stage == "waiting-for-remote-kv" else 4
    pair = Pair(tiny, prefill=config(), decode=config(slots=slots))
    pair.p.apply_settings(validate(pair.p.specs, {"max_batched_tokens": 16}))
    if slots == 1:      # someone decoding holds the decode instance's one slot
        other = pair.add(prompt_tokens=5, max_new_tokens=200, ignore_eos=True)
        while not pair.tokens(other):
            pair.step()
    rid = pair.add(prompt_tokens=40, max_new_tokens=50, ignore_eos=True)
    _stage(pair, rid, stage)
    pair.cancel(rid)
    if slots == 1:
        pair.cancel(other)
    pair.hold = False
    pair.until_idle()
    fins = pair.of(ev.Finished, rid)
    assert [f.reason for f in fins] == ["cancelled"]
    assert_clean(pair.p, pair.d)


def test_a_request_the_decode_cache_can_never_hold_is_rejected_and_its_blocks_freed(tiny):
    pair = Pair(tiny, prefill=config(), decode=config(kv_tokens=64))
    rid = pair.add(prompt_tokens=40, max_new_tokens=60)
    pair.until_idle()
    (rej,) = pair.of(ev.Rejected, rid)
    assert rej.code == "exceeds_cache" and not pair.of(ev.Finished, rid)
    assert_clean(pair.p, pair.d)



@pytest.mark.parametrize("behind", [False, True], ids=["just-taken", "behind-a-busy-slot"])
def test_a_handed_off_request_the_lowered_budget_can_never_hold_is_refused_not_left_waiting(tiny, behind):
    """The decode instance took it while it fitted; then the cache budget was lowered under it,
    before its keys and values were copied in: just taken, or after waiting a while for the
    decode instance's one slot. It is rejected, and every block on both sides comes back: it does
    not wait forever, holding the prefill instance's blocks and everyone behind it."""
    pair = Pair(tiny, prefill=config(), decode=config(slots=1 if behind else 4))
    if behind:          # someone decoding holds the decode instance's one slot
        other = pair.add(prompt_tokens=5, max_new_tokens=40, ignore_eos=True)
        while not pair.tokens(other):
            pair.step()
    pair.hold = True
    rid = pair.add(prompt_tokens=40, max_new_tokens=60)
    while not pair.handoffs:
        pair.step()
    pair.deliver()
    if behind:
        pair.route(pair.d.step())       # it cannot be admitted: the slot is taken
    (seq,) = pair.d.scheduler.waiting
    assert seq.id == rid and rid in pair.d.connector.remote and not seq.block_table
    pair.route(pair.d.apply_settings(validate(pair.d.specs, {"cache_tokens": 64})))
    pair.hold = False
    pair.until_idle()
    (rej,) = pair.of(ev.Rejected, rid)
    assert rej.code == "exceeds_cache" and not pair.of(ev.Finished, rid)
    assert_clean(pair.p, pair.d)


# ------------------------------------------------------------------ the two-process backend
import os  # noqa: E402
import signal  # noqa: E402

from engine.disagg.backend import DisaggBackend  # noqa: E402
from helpers import collect, tiny_factory, wait_until  # noqa: E402


def shm_names(backend):
    return [seg.name for seg in backend.instances.segments]


def in_shm(names):
    return [n for n in names if os.path.exists(f"/dev/shm/{n}")]


def settled(backend, since):
    """Both instances' latest stats, taken after `since`, show nothing running, waiting or held."""
    stats = backend.instances.stats
    return all(r in stats and stats[r].t > since and stats[r].running == 0 and stats[r].queue == 0
               and stats[r].cache_blocks_used == 0 for r in ("prefill", "decode")) and not backend.instances.flights


@pytest.fixture(scope="module")
def backend():
    b = DisaggBackend(tiny_factory, config()).start()
    names = shm_names(b)
    assert len(in_shm(names)) == 2
    yield b
    b.shutdown()
    assert not in_shm(names), "shared memory left in /dev/shm"
    assert not any(i.process.is_alive() for i in b.instances.by_role.values())


def test_the_backend_greedy_equals_generate_and_copies_kv_exactly(tiny, backend):
    """Through the real processes: greedy output equals generate's, the stages add up, and the
    decode instance's blocks hold the prefill instance's keys and values element for element."""
    from engine.core.kv_cache import PagedKVStore
    hello = backend.hello()
    assert [i["name"] for i in hello.instances] == ["prefill", "decode"]
    assert len({i["pid"] for i in hello.instances} | {os.getpid()}) == 3
    sub = backend.events.subscribe(replay=False)
    ids = tiny.tokenizer(LONG, add_special_tokens=False)["input_ids"]
    for n in (1, BS, 37):
        h = backend.submit(GenerateRequest(prompt=LONG, prompt_tokens=n, max_new_tokens=6, ignore_eos=True,
                                           stream=True))
        got = list(h.events(timeout=60))
        assert [e.token_id for e in got if isinstance(e, ev.Token)] == reference_ids(tiny, ids[:n], 6)
        fin = got[-1]
        assert fin.reason == "length" and sum(fin.stages.values()) == pytest.approx(fin.ttft, abs=1e-9)
    events = collect(sub, lambda es: sum(e["type"] == "kv_transfer" for e in es) == 3)
    moved = [e for e in events if e["type"] == "kv_transfer"][-1]
    assert moved["tokens"] == 36
    cfg = tiny.model.config
    segs = dict(zip(("prefill", "decode"), backend.instances.segments))
    stores = {r: PagedKVStore(cfg, 2048 // BS, BS, torch.float32, "cpu",
                              memory=torch.frombuffer(segs[r].buf, dtype=torch.uint8)) for r in segs}
    for kind in ("k", "v"):
        for s, d in zip(getattr(stores["prefill"], kind), getattr(stores["decode"], kind)):
            a = s[moved["src_blocks"]].reshape(-1, *s.shape[2:])[:36]
            b = d[moved["dst_blocks"]].reshape(-1, *d.shape[2:])[:36]
            assert a.abs().sum() > 0 and torch.equal(a, b)
    del stores, s, d, a, b      # the views must go before the segments close
    backend.events.unsubscribe(sub)


def test_the_backend_cancels_at_several_stages_and_leaks_nothing(backend):
    """Cancelled while queued on the prefill instance, once its keys and values moved, and while
    decoding: one `finished` (cancelled) each, and every block and slot back on both instances."""
    sub = backend.events.subscribe(replay=False)
    handles, seen = [], []
    h = backend.submit(GenerateRequest(prompt=LONG, max_new_tokens=400, ignore_eos=True, stream=True))
    backend.cancel(h.id)                                    # at once: most likely still on the prefill instance
    handles.append(h)
    for stage in ("kv_transfer", "token"):
        h = backend.submit(GenerateRequest(prompt=LONG, max_new_tokens=400, ignore_eos=True, stream=True))
        seen += collect(sub, lambda es: any(e["type"] == stage and e["id"] == h.id for e in es), timeout=60)
        backend.cancel(h.id)
        handles.append(h)
    since = backend.clock.now()
    for h in handles:
        ends = [e for e in h.events(timeout=60) if isinstance(e, (ev.Finished, ev.Rejected))]
        assert [e.reason for e in ends] == ["cancelled"]
    wait_until(lambda: settled(backend, since), 60, "both instances idle, every block back")
    seen += collect(sub, lambda es: True)
    backend.events.unsubscribe(sub)
    for h in handles:       # published once too
        assert [e["reason"] for e in seen if e["type"] == "finished" and e["id"] == h.id] == ["cancelled"]


def test_a_dead_instance_fails_what_is_in_flight_and_frees_the_shared_memory():
    b = DisaggBackend(tiny_factory, config()).start()
    names = shm_names(b)
    try:
        h = b.submit(GenerateRequest(prompt=LONG, max_new_tokens=400, ignore_eos=True, stream=True))
        first = h.next(timeout=60)
        assert isinstance(first, ev.Token)
        os.kill(b.instances.decode.info["pid"], signal.SIGKILL)
        ends = [e for e in h.events(timeout=60) if isinstance(e, ev.Finished)]
        assert [e.reason for e in ends] == ["error"] and "decode" in ends[0].error
        wait_until(lambda: b.health()[1] == 503, 30, "/healthz 503")
        late = b.submit(GenerateRequest(prompt="x", stream=True))
        (rej,) = list(late.events(timeout=10))
        assert isinstance(rej, ev.Rejected) and rej.code == "engine_error"
        wait_until(lambda: not in_shm(names), 30, "the shared memory freed")
        wait_until(lambda: not b.instances.prefill.process.is_alive(), 30, "the prefill instance stopped")
    finally:
        b.shutdown()
    assert not in_shm(names)


@pytest.mark.real_model
def test_the_real_model_disaggregated_equals_generate(real):
    """SmolLM2 in both processes (each loads it from the disk cache): greedy output equals
    generate's, on a prompt long enough to be chunked."""
    import functools
    from engine.model import loading
    from helpers import reference
    factory = functools.partial(loading.load, device=real.device, dtype="float32")
    b = DisaggBackend(factory, EngineConfig(slots=2, kv_tokens=1024, max_context=1024)).start()
    try:
        b.update_settings({"max_batched_tokens": 32})
        prompt = "The United States Declaration of Independence says that " + LONG
        h = b.submit(GenerateRequest(prompt=prompt, max_new_tokens=12, temperature=0, stream=True))
        got = [e.token_id for e in h.events(timeout=300) if isinstance(e, ev.Token)]
        assert got == reference(real, prompt, 12)
    finally:
        b.shutdown()


def test_a_cancel_that_reaches_the_prefill_instance_after_its_hand_off_follows_the_request():
    """The coordinator's routing alone (no processes): a cancel sent to the prefill instance
    while its hand-off is on the way is sent on to the decode instance behind the hand-off, and
    whatever an instance sends of a request already ended here is dropped (one end each)."""
    import threading
    from engine.disagg import child
    from engine.disagg.backend import Instances
    from engine.driver import Add, Cancel
    from engine.core.request import RequestHandle
    from engine.core.sequence import SamplingParams, Sequence

    class Fake:
        def __init__(self, role):
            self.role, self.sent = role, []

        def send(self, message):
            self.sent.append(message)

    inst = Instances.__new__(Instances)
    inst.prefill, inst.decode = Fake("prefill"), Fake("decode")
    inst.flights, inst.owner, inst.cancelled, inst.stats, inst.lock = {}, {}, set(), {}, threading.Lock()
    seq = Sequence(id="r1", source="api", prompt="x", prompt_ids=[1, 2], params=SamplingParams(),
                   handle=RequestHandle("r1", True))
    inst.add(seq)
    inst.cancel("r1")
    assert [type(m) for m in inst.prefill.sent] == [Add, Cancel]
    inst.route(inst.prefill, HandOff(seq))                  # it was handed off before the cancel arrived
    assert [type(m) for m in inst.decode.sent] == [child.Take, Cancel]
    fin = ev.Finished(t=1.0, id="r1", reason="cancelled", source="api", prompt_tokens=2, output_tokens=0, e2e=1.0)
    assert inst.route(inst.decode, fin) == [fin] and inst.route(inst.prefill, fin) == []
    assert list(seq.handle.events(timeout=0)) == [fin] and not inst.flights and not inst.cancelled
    inst.route(inst.decode, Release("r1"))
    assert isinstance(inst.prefill.sent[-1], child.ReleaseBlocks)
