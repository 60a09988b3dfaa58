"""The KV stores' shared memory: one segment per instance, created by the coordinator (the web
process) at the size each instance asks for, mapped by the instance whose store it is and, for
the prefill instance's, by the decode instance too (which copies from it); unlinked by the
coordinator when it stops, or when an instance dies, so nothing is left in /dev/shm.
"""
from multiprocessing import shared_memory

import torch


def create(nbytes):
    """A new zeroed segment of `nbytes` bytes (its `.name` for the instances)."""
    return shared_memory.SharedMemory(create=True, size=max(1, nbytes))


def attach(name):
    """(segment, a flat uint8 tensor over all of it): an instance's view of a segment."""
    seg = shared_memory.SharedMemory(name=name)
    return seg, torch.frombuffer(seg.buf, dtype=torch.uint8)


def free(segments):
    """Close and unlink the coordinator's segments (an instance's mapping outlives the name
    until it exits)."""
    for seg in segments:
        try:
            seg.close()
            seg.unlink()
        except FileNotFoundError:
            pass
