"""The waiting queue, one object per queue policy (vLLM V1's `create_request_queue(policy)`): which
waiting request the scheduler looks at next. The scheduler owns one (engine/core/scheduler.py) and
asks it only `peek`, `add`, `remove`, `prepend`, its length and order, and whom to preempt when
blocks run out (`victim`); what a step is filled with is the step policy's (engine/core/policies.py).
The `scheduling_policy` setting offers every queue registered in QUEUES, each described by its
`summary` (engine/settings.py reads both).
"""
import bisect
from collections import deque
import itertools

MAX_WAITING = 512   # requests a queue holds; more are refused (queue_full). Here, not in the scheduler:
                    # the API checks n samples against it without loading the model code


class FCFSQueue:
    """First come, first served (the default): nobody overtakes the head."""
    summary = "fcfs: first come, first served (a preempted request first again)"

    def __init__(self, seqs=()):
        self._q = deque(seqs)

    def add(self, seq):
        self._q.append(seq)

    def prepend(self, seq):
        """A preempted request: it waits at the front, to be recomputed first."""
        self._q.appendleft(seq)

    def peek(self):
        return self._q[0]

    def remove(self, seq):
        self._q.remove(seq)

    def victim(self, running):
        """Whom of the running requests (in admission order) to preempt when blocks run out: the
        most recently admitted (vLLM V1's)."""
        return running[-1]

    def __contains__(self, seq):
        return seq in self._q

    def __iter__(self):
        """In the order they would be admitted."""
        return iter(list(self._q))

    def __len__(self):
        return len(self._q)


class PriorityQueue:
    """vLLM's `priority` policy: the lowest `priority` value first (a request's own, default 0),
    then the earliest arrival; a preempted request goes back to its place in that order, and the
    request preempted when blocks run out is the running one last in it (the highest value, the
    latest arrival), so an urgent request is never preempted for a batch job."""
    summary = "priority: a request's priority first, lowest value first (vLLM's), then arrival; the last in that order preempted"

    def __init__(self, seqs=()):
        self._order = itertools.count()   # ties of priority and arrival keep the order they came in
        self._q = []                      # sorted (key, seq)
        for seq in seqs:
            self.add(seq)

    @staticmethod
    def _key(seq):
        return seq.params.priority, seq.arrival

    def add(self, seq):
        bisect.insort(self._q, (self._key(seq), next(self._order), seq), key=lambda e: e[:2])

    prepend = add   # a preempted request's place is its priority's and arrival's

    def peek(self):
        return self._q[0][2]

    def remove(self, seq):
        self._q = [e for e in self._q if e[2] is not seq]

    def victim(self, running):
        return max(running, key=self._key)

    def __contains__(self, seq):
        return any(e[2] is seq for e in self._q)

    def __iter__(self):
        return iter([e[2] for e in self._q])

    def __len__(self):
        return len(self._q)


QUEUES = {"fcfs": FCFSQueue, "priority": PriorityQueue}


def create_request_queue(policy, seqs=()):
    """A queue of `policy`'s order holding `seqs` (a live change of policy keeps who waits)."""
    return QUEUES[policy](seqs)
