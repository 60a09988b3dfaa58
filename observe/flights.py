"""Observe mode's requests in flight: each sent to the observed server from a thread of its
own, streamed, and published as the client sees it:

* `request` when it is sent; `token` for each streamed chunk that carries text, at the time
  it was read (vLLM streams one token per chunk; a server that groups tokens shows fewer,
  larger ones); `finished` with ttft, every gap between chunks, e2e, and the server's token
  counts from `usage`; `rejected` for an HTTP error.
* What happens inside the server (queueing, prefill, sampling) cannot be seen from here:
  those stages are `null` and the whole TTFT is `other`. Never invented.
* The odds, when a page shows candidates (`Observer` asks for logprobs then) and the server sends
  them: a chunk of one token gets its `p_raw` and `top` (texts and probabilities as the server
  reports them, ids and the transformed `p` unknown: null); a chunk of several tokens the
  probability of all of them together, and no candidates.
"""
import http.client
import itertools
import math
import secrets
import socket
import threading

from engine.events import Finished, Rejected, Request, Token
from engine.core.request import RequestHandle
from engine.settings import finite_number
from engine.timing.stats import RollingStats
from server import inputs
from server.errors import ApiError
from .target import error_message

MAX_IN_FLIGHT = 256       # each request is a thread; beyond this, new ones are refused


class Flight:
    """One request in flight: its connection, so another thread can cancel it."""

    def __init__(self, source, prompt, sink=None, seed=None):
        self.source = source
        self.prompt = prompt      # matched against llama.cpp's /slots (never published from there)
        self.seed = seed          # as sent; how llama.cpp's /slots names its requests
        self.sink = sink          # the request's handle: its own events, when the caller streams them (a student)
        self.conn = None
        self.cancelled = False
        self.first = False        # a chunk with text has arrived

    def put(self, event):
        if self.sink is not None:
            self.sink.put(event)

    def cancel(self):
        self.cancelled = True
        sock = self.conn.sock if self.conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)   # wakes the worker blocked reading the stream
            except OSError:
                pass


class Flights:
    """The requests in flight and the client-side figures measured from them (`stats`)."""

    def __init__(self, target, clock, events, load):
        self.target, self.clock, self.events, self.load = target, clock, events, load
        self.stats = RollingStats()
        self._lock = threading.Lock()
        self._live = {}
        self._ids = itertools.count(1)

    def __len__(self):
        return len(self._live)

    def sent(self):
        """Each request in flight's (prompt, seed) as sent, by id: how llama.cpp's /slots is matched."""
        with self._lock:
            return {rid: (f.prompt, f.seed) for rid, f in self._live.items()}

    def cancel(self, rid):
        with self._lock:
            flight = self._live.get(rid)
        if flight is not None:
            flight.cancel()

    def cancel_waiting(self):
        """Cancel every request still waiting for its first chunk: all a client can tell of the
        server's queue (some of them may be prefilling there already)."""
        with self._lock:
            waiting = [f for f in self._live.values() if not f.first]
        for f in waiting:
            f.cancel()

    def reset(self):
        """Cancel every request, and start the figures afresh."""
        with self._lock:
            flights = list(self._live.values())
        for f in flights:
            f.cancel()
        self.stats = RollingStats()

    def launch(self, source, path, body, prompt, model, profile, estimate=None, label=None, stream=False):
        """Send one request to `model` (None: refused, the server has not named one yet) on a
        thread of its own; its handle, which carries its own events when `stream`. `estimate`:
        a load request's (words, estimated tokens) (observe/load.py)."""
        rid = f"o{next(self._ids)}"
        handle = RequestHandle(rid, stream)
        if profile is not None and profile.tag_seed and "seed" not in body:
            body = {**body, "seed": secrets.randbelow(2**31)}   # see Profile.tag_seed
        flight = Flight(source, prompt, handle, body.get("seed"))
        with self._lock:
            full = len(self._live) >= MAX_IN_FLIGHT
            if not full and model is not None:
                self._live[rid] = flight
        t = self.clock.now()
        self.events.publish(Request(t=t, id=rid, source=source, prompt_tokens=estimate[1] if estimate else None,
                                    estimated=estimate is not None, max_new_tokens=body["max_tokens"],
                                    preview=prompt[:80], label=label))
        refusal = (f"the observer already has {MAX_IN_FLIGHT} requests in flight" if full else
                   "the server has not answered /v1/models yet" if model is None else None)
        if refusal:
            code = "queue_full" if full else "unreachable"
            rejected = Rejected(t=t, id=rid, reason=refusal, code=code)
            self.events.publish(rejected)
            flight.put(rejected)
            return handle
        body = {**body, "model": model, "stream": True, "stream_options": {"include_usage": True}}
        threading.Thread(target=self._run, args=(rid, flight, path, body, t, estimate), daemon=True,
                         name=f"observe-{rid}").start()
        return handle

    def _run(self, rid, flight, path, body, sent, estimate):
        """Stream one request and publish what the client sees, as it sees it."""
        chunks, usage, finish, error = [], None, None, None
        try:
            flight.conn = self.target.connection()
            if flight.cancelled:
                raise ConnectionAbortedError("cancelled")
            resp = self.target.post(flight.conn, path, body)
            if resp.status != 200:
                rejected = Rejected(t=self.clock.now(), id=rid, code=f"http_{resp.status}",
                                    reason=f"HTTP {resp.status}: {error_message(resp.read())}")
                self.events.publish(rejected)
                flight.put(rejected)
                return
            for line in resp:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = self.clock.now()
                texts, chunk_usage, chunk_finish, error, odds = read_chunk(data)
                if error is not None:
                    break
                usage, finish = chunk_usage or usage, chunk_finish or finish
                for text in texts:
                    flight.put(self._token(rid, len(chunks), text, now, chunks[-1] if chunks else None, sent,
                                           odds if len(texts) == 1 else {}))
                    flight.first = True
                    chunks.append(now)
        except ApiError as e:
            error = f"the observed server sent {e.message}"
        except (OSError, http.client.HTTPException, ValueError) as e:
            error = str(e) or type(e).__name__
        finally:
            if flight.conn is not None:
                flight.conn.close()
            with self._lock:
                self._live.pop(rid, None)
        if flight.cancelled:
            reason = "cancelled"
        elif error is not None:
            reason = "error"
        else:
            reason = finish if finish in ("stop", "length") else (finish or "error")
        flight.put(self._finished(rid, flight.source, reason, sent, chunks, usage, estimate, error))

    def _token(self, rid, index, text, now, previous, sent, odds):
        """Publish the `token` event of a chunk with text, with its `odds` (`read_chunk`); return
        it (for the request's handle)."""
        ev = Token(t=now, id=rid, index=index, token_id=None, text=text, first=index == 0, sampled=None,
                   sample_s=None, **odds)
        self.events.publish(ev)
        self.stats.token(now)
        if previous is None:
            self.stats.first_token(now - sent)
        else:
            self.stats.gap(now - previous)
        return ev

    def _finished(self, rid, source, reason, sent, chunks, usage, estimate, error):
        now = self.clock.now()
        usage = usage or {}
        output = usage.get("completion_tokens")   # None when the server sent no usage
        timed = {}   # what a client measured of a request that streamed anything
        if chunks:
            ttft = chunks[0] - sent
            timed = dict(ttft=ttft, gaps=[b - a for a, b in zip(chunks, chunks[1:])],
                         stages={"tokenize": None, "load": None, "queue": None, "prefill": None,
                                 "transfer": None, "first_sample": None, "delivery": None, "other": ttft})
            later = (len(chunks) if output is None else output) - 1   # per chunk without usage
            if later > 0:
                timed["tpot"] = (chunks[-1] - chunks[0]) / later
            self.stats.finished += 1
        ev = Finished(t=now, id=rid, reason=reason, source=source, prompt_tokens=usage.get("prompt_tokens"),
                      output_tokens=output, e2e=now - sent, client_side=True, chunks=len(chunks),
                      error=error, **{"gaps": [], **timed})
        if estimate and usage.get("prompt_tokens"):
            self.load.reported(estimate[0], usage["prompt_tokens"])
        self.events.publish(ev)
        return ev


def read_chunk(data):
    """One streamed chunk's (texts, usage, finish reason, error message, odds) from its JSON
    `data`: an observed server is a client too, so its depth and text are checked (ApiError),
    anything of the wrong shape is skipped, and usage keeps whole-number counts only. `odds`:
    the token event's `p_raw` and `top` from the chunk's log-probabilities ({} without)."""
    msg = inputs.loads(data)
    if not isinstance(msg, dict):
        raise ValueError(f"a stream chunk that is not a JSON object: {data[:80]!r}")
    if msg.get("error"):
        return [], None, None, error_message(data), {}
    usage = None
    if isinstance(msg.get("usage"), dict):
        usage = {k: v for k, v in msg["usage"].items()
                 if type(v) is int and v >= 0 and k in ("prompt_tokens", "completion_tokens")}
    texts, finish, entries = [], None, []
    choices = msg.get("choices")
    for choice in choices if isinstance(choices, list) else []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        text = choice.get("text") if "text" in choice else (delta.get("content") if isinstance(delta, dict) else None)
        if isinstance(text, str) and text:
            texts.append(text)
        if isinstance(choice.get("finish_reason"), str) and choice["finish_reason"]:
            finish = choice["finish_reason"]
        entries += _entries(choice.get("logprobs"))
    return texts, usage, finish, None, _odds(entries)


def _number(x):
    return finite_number(x) and x <= 0


def _entries(logprobs):
    """[(logprob, [(text, logprob)] most likely first)] per token of a choice's `logprobs`, in
    either shape (chat's `content` list, completions' `token_logprobs` and `top_logprobs`);
    entries of the wrong shape are left out."""
    if not isinstance(logprobs, dict):
        return []
    out = []
    if isinstance(logprobs.get("content"), list):      # chat
        for e in logprobs["content"]:
            if isinstance(e, dict) and _number(e.get("logprob")):
                top = e.get("top_logprobs") if isinstance(e.get("top_logprobs"), list) else []
                out.append((e["logprob"], [(t["token"], t["logprob"]) for t in top if isinstance(t, dict)
                                           and isinstance(t.get("token"), str) and _number(t.get("logprob"))]))
    elif isinstance(logprobs.get("token_logprobs"), list):   # completions
        tops = logprobs.get("top_logprobs") if isinstance(logprobs.get("top_logprobs"), list) else []
        for i, lp in enumerate(logprobs["token_logprobs"]):
            top = tops[i] if i < len(tops) and isinstance(tops[i], dict) else {}
            if _number(lp):
                out.append((lp, sorted(((t, v) for t, v in top.items() if isinstance(t, str) and _number(v)),
                                       key=lambda tv: -tv[1])))
    return out


def _odds(entries):
    """A chunk's token-event odds: one token's `p_raw` and `top`; several tokens' joint `p_raw`."""
    if not entries:
        return {}
    if len(entries) > 1:
        return {"p_raw": math.exp(sum(lp for lp, _ in entries))}
    lp, top = entries[0]
    return {"p_raw": math.exp(lp), "top": [(None, text, None, math.exp(v)) for text, v in top]}
