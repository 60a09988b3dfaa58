"""Scheduler unit tests: a `Scheduler` driven directly over a block manager (no model, no
engine): its queue and its order, admissions, preemption, refusals, the policies' plans, the
step-time target, and the connector's hooks at admission and at the end."""
import typing

from engine import events as ev
from engine.core.block_manager import BlockManager
from engine.core.connector import KVConnector
from engine.core.kv_cache import BlockPool
from engine.core.policies import BY_SETTING, Blocked
from engine.core.queues import PriorityQueue, create_request_queue
from engine.core.scheduler import Scheduler
from engine.core.sequence import SamplingParams, Sequence, Status
from engine.settings import Policy
from engine.timing.stepcost import StepCost


def synthetic(rid, ids, max_new_tokens=4):
    return Sequence(id=rid, source="load", prompt="", prompt_ids=list(ids),
                    params=SamplingParams(max_new_tokens=max_new_tokens))


def scheduler(num_blocks=64, block_size=4, slots=2, connector=None):
    return Scheduler(BlockManager(BlockPool(block_size=block_size, num_blocks=num_blocks)), max_slots=slots,
                     step_cost=StepCost(), connector=connector)


def computed(sched, plan):
    """The forward ran: every segment's positions hold keys and values now."""
    for seg in plan.segments:
        sched.blocks.computed(seg)


def test_the_newest_request_is_preempted_to_the_front_of_the_queue():
    """Two 8-token prompts fill four blocks; the older one's first output token needs a fifth:
    the newer one is preempted (blocks freed, status waiting again, first in the queue), and
    comes back only once all it had fits again."""
    blocks = BlockManager(BlockPool(block_size=4, num_blocks=4))
    sched = Scheduler(blocks, max_slots=2, step_cost=StepCost())
    a, b, c = synthetic("a", range(8)), synthetic("b", range(100, 108)), synthetic("c", range(200, 204))
    for seq in (a, b, c):
        sched.add(seq)
    plan = sched.schedule(kv_cache_on=True)
    assert plan.admitted == [a, b] and a.status is b.status is Status.RUNNING and blocks.used == 4
    assert sched.blocked_on(True) is Blocked.SLOT and c.status is Status.WAITING
    for seg in plan.segments:
        blocks.computed(seg)
    a.output_ids.append(1)
    b.output_ids.append(2)
    plan = sched.schedule(kv_cache_on=True)
    assert plan.preempted == [b] and [g.seq for g in plan.segments] == [a]
    assert b.status is Status.WAITING and list(sched.waiting) == [b, c]
    assert (b.block_table, b.num_computed, b.preemptions, b.slot) == ([], 0, 1, None)
    assert sched.blocked_on(True) is Blocked.CACHE    # its 9 tokens and the next need 3 blocks; 1 is free
    sched.finish(a)
    assert a.status is Status.FINISHED and blocks.used == 0
    plan = sched.schedule(kv_cache_on=True)
    assert plan.admitted == [b, c] and sum(g.n for g in plan.segments if g.seq is b) == 9


def test_the_step_time_target_cuts_mixed_steps_only():
    """`prefill_cap` is what the step-time target allowed the last step: under `mixed`, once the
    costs are known, a prompt's chunk is cut to it; the other policies have no target (None)."""
    sched = Scheduler(BlockManager(BlockPool(block_size=4, num_blocks=64)), max_slots=2, step_cost=StepCost())
    sched.max_step_s = 0.040
    for rows, tokens in ((4, 0), (0, 64), (4, 400), (2, 128)) * 4:   # 10 ms + 2 ms a row + 0.5 ms a token
        sched.step_cost.observe(rows, tokens, 0.010 + rows * 0.002 + tokens * 0.0005)
    sched.add(synthetic("a", range(100)))
    plan = sched.schedule(kv_cache_on=True)
    assert sched.prefill_cap == plan.prefill_cap == 60          # (40 ms - 10 ms) / 0.5 ms: no decode rows
    assert [g.n for g in plan.segments] == [60]
    for seg in plan.segments:
        sched.blocks.computed(seg)
    sched.policy = BY_SETTING[Policy.PREFILL_FIRST]
    plan = sched.schedule(kv_cache_on=True)
    assert sched.prefill_cap is None and [(g.start, g.n) for g in plan.segments] == [(60, 40)]   # the rest, whole


def test_blocked_on_reasons_are_the_wire_strings():
    """`stats.blocked_on` is the `Blocked` enum in the engine, and the protocol's strings are
    its values (on the wire it is the plain string: test_stats_report_the_queue_when_due)."""
    (literal, _none) = typing.get_args(typing.get_type_hints(ev.Stats)["blocked_on"])
    assert set(typing.get_args(literal)) == {b.value for b in Blocked}


def test_the_queue_admits_in_arrival_order_and_nobody_overtakes_its_head():
    """First come, first served: a head that does not fit yet (blocks) keeps a small request
    behind it waiting, though that one would fit."""
    sched = scheduler(num_blocks=14, slots=4)     # 56 tokens: the running one holds 8 blocks
    big, small = synthetic("big", range(40)), synthetic("small", range(100, 102))
    running = synthetic("run", range(200, 230))
    sched.add(running)
    computed(sched, sched.schedule(kv_cache_on=True))
    sched.add(big)
    sched.add(small)
    plan = sched.schedule(kv_cache_on=True)
    assert plan.admitted == [] and list(sched.waiting) == [big, small]
    assert sched.blocked_on(True) is Blocked.CACHE
    sched.finish(running)
    plan = sched.schedule(kv_cache_on=True)
    assert plan.admitted[0] is big


def test_finish_is_the_one_way_out_from_the_queue_or_a_slot():
    """A request finishing while it waits leaves the queue; one finishing in a slot gives the slot
    and its blocks back; either way it holds nothing after."""
    sched = scheduler(slots=1)
    a, b = synthetic("a", range(8)), synthetic("b", range(100, 108))
    sched.add(a)
    sched.add(b)
    computed(sched, sched.schedule(kv_cache_on=True))
    assert a.status is Status.RUNNING and b.status is Status.WAITING and sched.blocks.used == 2
    sched.finish(b)
    assert not sched.waiting and b.status is Status.FINISHED
    sched.finish(a)
    assert sched.slots == [None] and not sched.running and sched.blocks.used == 0 and a.block_table == []


def test_a_request_the_lowered_budget_can_never_hold_is_refused_not_left_waiting():
    sched = scheduler(num_blocks=64)
    sched.add(synthetic("a", range(40), max_new_tokens=20))
    sched.blocks.configure(True, 32)
    plan = sched.schedule(kv_cache_on=True)
    (seq, reason), = plan.refused
    assert seq.id == "a" and seq.status is Status.FINISHED and "60 tokens" in reason
    assert not sched.waiting and sched.blocks.used == 0


class Elsewhere(KVConnector):
    """A connector whose keys and values for each prompt but its last position are elsewhere,
    and which keeps the blocks of requests that end without a finish reason."""
    def __init__(self):
        self.allocated_for, self.kept = [], []

    def external_tokens(self, seq):
        return len(seq.prompt_ids) - 1 if not seq.output_ids else 0

    def allocated(self, seq):
        self.allocated_for.append((seq, seq.num_computed))

    def finished(self, seq):
        if seq.finish_reason is None:
            self.kept.append(seq)
            return True
        return False


def test_the_connector_is_asked_at_admission_and_at_the_end():
    """External tokens are allocated blocks and counted computed, but are no prefix hit; the
    first segment computes only the rest; a request whose blocks the connector keeps at its end
    holds them until the connector lets them go."""
    conn = Elsewhere()
    sched = scheduler(connector=conn)
    a = synthetic("a", range(10))
    sched.add(a)
    plan = sched.schedule(kv_cache_on=True)
    assert conn.allocated_for == [(a, 9)] and a.num_computed == 9 and len(a.block_table) == 3
    assert [(g.start, g.n, g.logits) for g in plan.segments] == [(9, 1, True)]
    assert a.admitted_cached == 9 and a.cached_tokens == 0 and sched.blocks.queries == 0
    sched.finish(a)          # no finish reason: it goes on elsewhere, its blocks kept
    assert conn.kept == [a] and sched.blocks.used == 3 and sched.slots == [None, None]
    sched.blocks.free(a)
    assert sched.blocks.used == 0


def test_the_priority_queue_orders_by_priority_then_arrival_and_names_the_last_as_victim():
    """vLLM's priority policy: lower values first, ties by arrival; a preempted request goes back
    to its own place; the victim is the running request last in that order; switching the policy
    keeps who waits, in the new order."""
    def req(rid, priority, arrival):
        seq = synthetic(rid, range(4))
        seq.params.priority, seq.arrival = priority, arrival
        return seq

    batch1, batch2, urgent, later = req("b1", 10, 1.0), req("b2", 10, 2.0), req("u", 0, 3.0), req("l", 10, 4.0)
    q = PriorityQueue()
    for seq in (batch1, batch2, urgent, later):
        q.add(seq)
    assert list(q) == [urgent, batch1, batch2, later] and q.peek() is urgent and len(q) == 4
    q.remove(batch1)
    q.prepend(batch1)               # preempted: back to its place, not the front
    assert list(q) == [urgent, batch1, batch2, later] and batch1 in q
    assert q.victim([urgent, batch1, later, batch2]) is later
    fcfs = create_request_queue("fcfs", q)
    assert list(fcfs) == [urgent, batch1, batch2, later] and fcfs.victim([urgent, batch1]) is batch1
    assert list(create_request_queue("priority", [later, urgent])) == [urgent, later]


def test_under_the_priority_policy_blocks_running_out_preempt_the_lowest_priority():
    """Two running requests fill the blocks; the older has the lower priority: it is the one
    preempted when the newer needs a block (fcfs would preempt the newer)."""
    for policy, victim in (("priority", "batch"), ("fcfs", "urgent")):
        sched = scheduler(num_blocks=4, slots=2)
        sched.queue_policy, sched.waiting = policy, create_request_queue(policy)
        batch, urgent = synthetic("batch", range(8)), synthetic("urgent", range(100, 108))
        batch.params.priority, urgent.params.priority = 10, 0
        batch.arrival, urgent.arrival = 0.0, 1.0
        sched.add(batch)
        sched.add(urgent)
        computed(sched, sched.schedule(kv_cache_on=True))
        batch.output_ids.append(1)
        urgent.output_ids.append(2)
        plan = sched.schedule(kv_cache_on=True)
        assert [s.id for s in plan.preempted] == [victim], policy
