"""The KV connector: the one object through which an engine works with keys and values computed
somewhere else, as vLLM V1's scheduler and workers hold a single optional `KVConnector`. A
colocated engine holds this base, whose hooks change nothing; prefill/decode disaggregation is
a pair of connectors in engine/disagg/connector.py. The engine and its scheduler name no
connector but this one, and call its hooks at a request's three moments:

  admitted (the scheduler, `admit`)
    `external_tokens(seq)`  prompt positions whose keys and values this engine loads instead of
                            computing (vLLM's `get_num_new_matched_tokens`); blocks are allocated
                            for them as for a prefix hit
    `allocated(seq)`        its blocks are allocated, those too (vLLM's `update_state_after_alloc`)
    `load(out)`             the engine, before the step's forward: copy them in (vLLM's worker
                            `start_load_kv`), each copy noted in the StepOutput (`Loaded`)
    `samples`               whether a prompt's last position wants logits here
  its prompt computed (the engine, after the forward)
    `leaves(seq)`           whether its work here is done, to go on elsewhere (it ends here without
                            a finish reason, and without a `finished` event)
  ended (the scheduler, `finish`: done, cancelled, failed, refused, or gone on)
    `finished(seq)`         True keeps its blocks for the connector (vLLM's `request_finished`
                            asking for a delayed free); it frees them itself later
and, with every call's events, `outbox()`: messages for other engines, which travel beside the
events but are no wire events (whoever runs the engine routes them).
"""


class KVConnector:
    name = None         # the instance this engine is, named in its events (None: the only one)
    samples = True

    def bind(self, engine):
        """Once, by the engine it serves, after its blocks and KV store exist."""

    def external_tokens(self, seq):
        return 0

    def allocated(self, seq):
        pass

    def load(self, out):
        pass

    def leaves(self, seq):
        return False

    def finished(self, seq):
        return False

    def outbox(self):
        return []
