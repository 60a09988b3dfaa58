"""The waiting queue, one object per queue policy (vLLM V1's `create_request_queue(policy)`): which
waiting request the scheduler looks at next. The scheduler owns one (engine/core/scheduler.py) and
asks it only `peek`, `add`, `remove`, `prepend` and its length and order; what a step is filled
with is the step policy's (engine/core/policies.py).

    fcfs   first come, first served: arrival order; a preempted request goes back to the front
"""
from collections import deque


class FCFSQueue:
    """First come, first served (the default): nobody overtakes the head."""

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
