"""The waiting queue, one object per queue policy (vLLM V1's `create_request_queue(policy)`): which
waiting request the scheduler looks at next. The scheduler owns one (engine/core/scheduler.py) and
asks it only `peek`, `add`, `remove`, `prepend`, its length and order, and whom to preempt when
blocks run out (`victim`); what a step is filled with is the step policy's (engine/core/policies.py).
The `scheduling_policy` setting offers every queue registered in QUEUES, each described by its
`summary` (engine/settings.py reads both).
"""
from collections import deque


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


QUEUES = {"fcfs": FCFSQueue}


def create_request_queue(policy, seqs=()):
    """A queue of `policy`'s order holding `seqs` (a live change of policy keeps who waits)."""
    return QUEUES[policy](seqs)
