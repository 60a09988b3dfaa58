"""The one stepping harness of the engine tests: engines stepped by hand in this process, every
event they return kept in order. `Run` drives one engine; `Pair` a prefill and a decode engine
(engine/disagg/connector.py), the harness being their coordinator."""
import pickle

from engine import Engine, GenerateRequest
from engine import events as ev
from engine.disagg.connector import DecodeConnector, PrefillConnector
from engine.disagg.messages import HandOff, Release


class Recorded:
    """Every event returned, in order, and what the tests ask of them."""

    def of(self, kind, rid=None):
        return [e for e in self.events if isinstance(e, kind) and (rid is None or e.id == rid)]

    def tokens(self, rid):
        return [e.token_id for e in self.of(ev.Token, rid)]

    def finished(self, rid):
        (fin,) = self.of(ev.Finished, rid)
        return fin


class Run(Recorded):
    """Requests added at chosen steps to one engine."""

    def __init__(self, engine):
        self.engine = engine
        self.events = []
        self.ids = []

    def add(self, prompt, **kw):
        seq = self.engine.new_sequence(GenerateRequest(prompt=prompt, **kw))
        self.ids.append(seq.id)
        self.events += self.engine.add(seq)
        return seq.id

    def step(self, n=1):
        for _ in range(n):
            self.events += self.engine.step()

    def until_idle(self, limit=5000):
        for _ in range(limit):
            if not (self.engine.scheduler.running or self.engine.scheduler.waiting):
                return self
            self.step()
        raise AssertionError("engine did not go idle")


class Pair(Recorded):
    """A prefill and a decode Engine, each with its connector, on one clock: each hand-off goes to
    the decode engine in its inter-process form (pickled, as down the pipe between the processes),
    unless `hold` keeps it back; each release goes to the prefill engine. `prompt`: what requests
    ask unless they say."""

    def __init__(self, bundle, prefill, decode, prompt=None):
        self.prompt = prompt
        self.p = Engine(bundle, prefill, connector=PrefillConnector())
        self.d = Engine(bundle, decode, clock=self.p.clock, connector=DecodeConnector(self.p.store))
        self.events, self.handoffs, self.hold = [], [], False

    def route(self, out):
        for e in out:
            if isinstance(e, HandOff):
                self.handoffs.append(pickle.loads(pickle.dumps(e)))
                if not self.hold:
                    self.deliver()
            elif isinstance(e, Release):
                self.route(self.p.connector.release(e.id))
            else:
                self.events.append(e)

    def deliver(self):
        while self.handoffs:
            self.route(self.d.enqueue(self.d.connector.adopt(self.handoffs.pop(0))))

    def add(self, prompt=None, **kw):
        seq = self.p.new_sequence(GenerateRequest(prompt=prompt or self.prompt, **kw))
        self.route(self.p.add(seq))
        return seq.id

    def step(self, n=1):
        for _ in range(n):
            self.route(self.p.step())
            self.route(self.d.step())

    def until_idle(self, limit=2000):
        for _ in range(limit):
            if not any(e.scheduler.running or e.scheduler.waiting for e in (self.p, self.d)) and not self.handoffs:
                return self
            self.step()
        raise AssertionError("the pair did not go idle")

    def cancel(self, rid):
        """As the coordinator does: to the instance that owns the request now."""
        owner = self.d if any(h.id == rid for h in self.handoffs) or rid in self.d._by_id else self.p
        if owner is self.d:
            self.deliver()
        self.route(owner.cancel(rid))


def assert_clean(*engines):
    """Nothing left anywhere: every block free (no reference held), every slot, the queue, no
    request known, nothing a connector holds."""
    for e in engines:
        assert e.blocks.used == 0 and not any(e.blocks.pool.ref), e.connector.name
        assert len(e.blocks.pool.free) == e.blocks.capacity
        assert e.scheduler.slots == [None] * e.scheduler.max_slots
        assert e.scheduler.kv_tokens_in_use == 0
        assert not e.scheduler.running and not e.scheduler.waiting and e.in_flight == 0
        assert not getattr(e.connector, "held", None) and not getattr(e.connector, "remote", None)
