"""Prefill/decode disaggregation (vLLM V1's P/D with the NixlConnector; DistServe): one engine
process computes prompts, another decodes, and each request's keys and values move between
them through shared memory. One module a job:

    connector  the prefill and the decode instance's KV connectors (engine/core/connector.py): the
               hand-off of a computed prompt, its held blocks, the copy before the decode forward
    messages   what the instances tell each other through the coordinator (not wire events)
    transfer   the copy of a request's KV blocks from the prefill store into the decode one's
    shm        the stores' shared-memory segments: created, mapped, freed
    child      one engine process: its Engine (with its connector) and an EngineDriver, fed by a pipe
    backend    DisaggBackend: the web process's side, a Backend over the two processes

Beside the core: the engine names only its connector; nothing here is imported by a colocated
engine.
"""
