"""Observe mode (`python app.py --observe URL`): the page's picture of an external
OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp, another First Token), drawn from
what a client can measure. It is a `Backend` (engine/backend.py) beside the engine's driver;
the web layer (server/) serves either.

    backend   Observer, the Backend: settings, controls, hello, /healthz
    target    the server's address, its /metrics address and API key; the requests made to it
    flights   the requests in flight, each streamed on its own thread and published as events
    load      the load generator's prompts, cut in words for a tokenizer unknown here
    ticker    the clock thread: load arrivals and `stats`
    watch     the watcher thread: /v1/models (reachable, the model) and the scraper
    scrape    the server's /metrics (and /slots, its version) read through its profile
    profiles  which server it is, and how its metrics map onto the page's figures

`stats.server` carries the server's own figures (running, waiting, KV usage, rates of its
counters, llama.cpp's slots) with the scrape's age; `hello.server` names the server;
`stats.measured_by` says which figures are whose. Classroom mode works here too: students'
prompts are sent through `submit` with their name as label, and their answers stream back
through the request's handle.
"""
from .backend import API_KEY_ENV, Observer
from .target import parse_target

__all__ = ["API_KEY_ENV", "Observer", "parse_target"]
