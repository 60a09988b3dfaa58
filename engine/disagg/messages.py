"""What the two instances tell each other, through the coordinator (engine/disagg/backend.py).
They travel beside the events an engine returns, but are no wire events: the coordinator routes
them and never publishes them.

As vLLM's P/D: the prefill instance's request ends with its KV blocks held and the remote block
ids handed to the decode instance (`HandOff`, vLLM's kv_transfer_params with remote_block_ids);
the decode instance reads them and tells the prefill instance it may free them (`Release`, the
NIXL notification that ends the delayed free)."""
from dataclasses import dataclass


@dataclass(frozen=True)
class HandOff:
    """Prefill -> decode: a request whose prompt is computed, its Sequence in its inter-process
    form (`Sequence.__getstate__`): its block table the prefill instance's blocks holding the
    prompt's keys and values, its `times` its record so far (its tokenize, queue and prefill
    stages; `queued_at` when its last prompt forward ended)."""
    seq: object

    @property
    def id(self):
        return self.seq.id


@dataclass(frozen=True)
class Release:
    """Decode -> prefill: the request's blocks there are no longer needed (copied, or the
    request ended before they were)."""
    id: str


@dataclass(frozen=True)
class Ack:
    """An instance -> the coordinator: the command sent with this token has run and its events
    are out (engine/disagg/child.py `Acked`)."""
    token: int
