"""One engine process of a disaggregated server: the prefill or the decode instance.

Started by the coordinator (engine/disagg/backend.py) with the multiprocessing spawn context,
it builds its model bundle from a picklable factory, sets its model threads, asks for and maps
its store's shared memory (and the decode instance the prefill instance's), builds an `Engine`
with its role's connector on the coordinator's clock, and runs an `EngineDriver` on it (its engine thread
only: the coordinator generates load) whose events go down the pipe. The main thread feeds the
driver's inbox from the pipe: the driver's own commands (`Add`, `Cancel`, `ChangeSettings`,
`ResetEngine`, `ClearQueue`) and the two below, and exits when the pipe closes, when told to
(None), or when its engine has failed (the coordinator sees it go and fails what was in flight).
"""
from dataclasses import dataclass
import os
import threading

from . import shm
from .messages import Ack


# ------------------------------------------------------------------ the instance's own commands
@dataclass(frozen=True)
class Take:
    """Decode instance: a request the prefill instance handed off."""
    handoff: object

    def run(self, driver):
        engine = driver.engine
        return engine.enqueue(engine.connector.adopt(self.handoff))


@dataclass(frozen=True)
class ReleaseBlocks:
    """Prefill instance: the decode instance no longer needs a handed-off request's blocks."""
    rid: str

    def run(self, driver):
        return driver.engine.connector.release(self.rid)


@dataclass(frozen=True)
class Acked:
    """Any command, then an `Ack` once its events are out: the coordinator waits for it."""
    command: object
    token: int

    def run(self, driver):
        return self.command.run(driver) + [Ack(self.token)]


class PipeOut:
    """The driver's publisher here: each event (and message) down the pipe, in order."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()
        self.subscribers = 0    # pages listen to the coordinator

    def publish(self, event):
        with self.lock:
            self.conn.send(event)


def main(role, factory, configs, threads, origin, conn, bench=None):
    """The process's body (multiprocessing target): see the module's docstring."""
    import torch
    from engine import Engine, EngineDriver
    from engine.events import Clock
    from engine.core.kv_cache import PagedKVStore
    from engine.disagg.connector import DecodeConnector, PrefillConnector

    torch.set_num_threads(threads)
    bundle = factory()
    cfg = bundle.model.config

    def blocks(config):
        return config.cache_capacity_tokens // config.block_size

    conn.send(("store", PagedKVStore.nbytes_for(cfg, blocks(configs[role]), configs[role].block_size, bundle.dtype)))
    names = conn.recv()
    own, memory = shm.attach(names[role])
    if role == "decode":
        pc = configs["prefill"]
        _, peer_memory = shm.attach(names["prefill"])
        connector = DecodeConnector(PagedKVStore(cfg, blocks(pc), pc.block_size, bundle.dtype, bundle.device,
                                                 memory=peer_memory))
    else:
        connector = PrefillConnector()
    engine = Engine(bundle, configs[role], bench=bench, clock=Clock(*origin), kv_memory=memory, connector=connector)
    driver = EngineDriver(engine)
    driver.events = PipeOut(conn)
    conn.send(("ready", {"hello": engine.hello(), "specs": engine.specs, "tokenizer": bundle.tokenizer,
                         "max_context": engine.max_context, "pid": os.getpid(), "threads": threads,
                         "max_slots": engine.scheduler.max_slots, "cache_blocks": engine.blocks.capacity,
                         "kv_store_bytes": engine.store.nbytes, "name": bundle.name, "device": bundle.device,
                         "dtype": bundle.dtype_name, "load_s": bundle.load_s, "from_cache": bundle.from_cache}))
    driver.start(load=False)    # its events follow `ready`
    try:
        while driver.failure is None:
            if not conn.poll(0.2):
                continue
            command = conn.recv()
            if command is None:
                break
            driver._command(command)
    except (EOFError, OSError):
        pass        # the coordinator is gone
    finally:
        driver.shutdown()
    # The store's tensors still point into the segments: leave without closing them (the
    # coordinator unlinks the names; the mappings go with the process).
    os._exit(0)
