"""`docqa serve`: the embedded engine as an OpenAI-compatible chat server.

Endpoints: `GET /v1/models` and `POST /v1/chat/completions` (`stream: true` answers as
server-sent events, `data: {chat.completion.chunk}` … `data: [DONE]`). Standard library only
(`http.server`); bound to 127.0.0.1 unless told otherwise. One worker thread runs the engine
(one set of weights): concurrent completions are batched (engine/batch.py: on the CUDA
decoder they decode together, joining and leaving the batch at every step; elsewhere they run
one after another); `/v1/models` still answers while completions run.

Load. Up to MAX_WAITING completions wait for the engine; the listening socket's backlog is as
long, so that many clients connecting at once are all accepted, and the one after them is
answered 503 at once rather than left hanging. A body over MAX_BODY_BYTES is refused (413)
before it is read, a prompt that with its `max_tokens` exceeds MAX_CONTEXT_TOKENS (400) before
any model work; a client that goes away — waiting, or while its answer is computed — has its
work cancelled, so it never holds the engine from the clients still there.

Prefix caching: a prompt longer than one KV segment is prefilled into the engine's sparse
state through the per-document prefix cache (engine/prefix_cache.py), so a later prompt that
starts with the same full segments — the same long document followed by another question —
prefills only what follows them. The cache's hash chain commits to every token before a
segment, so two prompts share KV only where their tokens agree. Shorter prompts run on the
dense state, as `docqa ask` does.

Sampling: greedy unless `temperature` > 0 (`top_p`, `seed` honoured); `stop` strings and
`n` > 1 are not supported (a request asking for them is refused, not silently changed).
"""

from __future__ import annotations

import json
import queue
import secrets
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Annotated, Optional

import typer

from .clikit import cli_errors, err
from .errors import DocqaError

MAX_TOKENS_LIMIT = 8192
# The engine's longest context (SPEC §3: `engine bench --context` up to 1,048,576 tokens): a
# prompt and its max_tokens together get no more.
MAX_CONTEXT_TOKENS = 1 << 20
# A body past this is refused before it is read: 1M tokens of text and its JSON escaping fit.
MAX_BODY_BYTES = 8 << 20
MAX_WAITING = 128  # completions queued for the engine; also the listening socket's backlog
CANCEL_CHECK_S = 0.25  # how often a running completion looks whether its client went away
# How often a streamed answer sends what was generated since (one event, the text of all the new
# tokens): the handler reads the request's tokens and turns them into text itself, so the engine's
# worker does nothing per token for a stream, and 32 streams cost the worker no more than one.
STREAM_EVERY_S = 0.05
# Doc key of served prompts in the prefix cache: clients send prompts, not documents; the
# hash chain over the tokens keeps every prompt's KV its own.
SERVE_KEY = "docqa-serve"


class RequestError(Exception):
    """A bad request: answered 400 with an OpenAI-style error body."""


class _TooLarge(RequestError):
    """A request body over MAX_BODY_BYTES: answered 413."""


class ClientGone(Exception):
    """The client closed the connection: its completion is cancelled."""


class Busy(Exception):
    """MAX_WAITING completions wait already: answered 503."""


@dataclass
class Completion:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(eq=False)
class _Job:
    """A completion on its way through the worker: the handler reads `out` — the Completion or the
    exception that ended it — and, when streaming, the tokens generated so far (`generated`)."""

    ids: list[int]
    options: dict
    out: queue.Queue = field(default_factory=queue.Queue)
    request: object = None  # engine/batch.py Request, once the session has it
    tokens: list[int] = field(default_factory=list)  # generated so far, where it runs alone
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True
        if self.request is not None:
            self.request.cancel()

    def generated(self) -> list[int]:
        """The tokens generated so far (read from the handler's thread while the worker appends)."""
        return list(self.request.seq.output) if self.request is not None else list(self.tokens)


@dataclass
class ServedEngine:
    """One engine, run by one worker thread: completions are queued to it, and it runs those that
    fit the engine's batch session together (continuous batching on the CUDA decoder: a
    request joins the batch at the next step and leaves when it ends). A long prompt runs alone,
    through the prefix cache (`_runs_alone`). The worker holds `lock` while the engine
    works."""

    engine: object
    name: str
    prefix_cache: object | None = None  # PrefixCache; None: made on the first long prompt
    lock: threading.Lock = field(default_factory=threading.Lock)
    max_waiting: int = MAX_WAITING
    max_context: int = MAX_CONTEXT_TOKENS
    _queued: int = 0  # completions admitted and not finished (waiting or running)
    _count_lock: threading.Lock = field(default_factory=threading.Lock)
    _jobs: queue.Queue = field(default_factory=queue.Queue)
    _worker: threading.Thread | None = None

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        from ..engine.chat import render_chat, template_of

        tok = self.engine.tokenizer
        text = render_chat(template_of(tok), messages, bos_token=tok.token_text(tok.bos_id),
                           eos_token=tok.token_text(tok.eos_id))
        return tok.encode(text, add_bos=False)

    def complete(self, messages: list[dict], *, max_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int | None = None, on_start=None, on_delta=None, gone=lambda: False) -> Completion:
        """Generate the answer to `messages`. Busy when max_waiting completions are queued
        already, RequestError when the prompt is too long; else `on_start()` is called (the
        request is accepted) before it waits for the engine. `gone()` says whether the client
        went away: it is asked while the request waits and every CANCEL_CHECK_S while it runs,
        and ClientGone ends the work then."""
        with self._count_lock:
            if self._queued >= self.max_waiting:
                raise Busy()
            self._queued += 1
        try:
            ids = self.prompt_ids(messages)
            if len(ids) + max_tokens > self.max_context:
                raise RequestError(f"the prompt ({len(ids):,} tokens) and max_tokens ({max_tokens:,}) exceed "
                                   f"the served {self.max_context:,}-token context")
            if on_start is not None:
                on_start()
            job = _Job(ids, dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed))
            self._submit(job)
            try:
                return self._await(job, on_delta, _Watch(gone))
            except ClientGone:
                job.cancel()
                raise
        finally:
            with self._count_lock:
                self._queued -= 1

    def _await(self, job: _Job, on_delta, watch) -> Completion:
        from ..engine.tokenizer import TextStream

        text = TextStream(self.engine.tokenizer) if on_delta is not None else None
        sent = 0

        def flush() -> None:  # the text of the tokens generated since the last flush, as one delta
            nonlocal sent
            new = job.generated()[sent:]
            sent += len(new)
            delta = "".join(text.push(t) for t in new)
            if delta:
                on_delta(delta)

        while True:
            try:
                item = job.out.get(timeout=STREAM_EVERY_S if text is not None else CANCEL_CHECK_S)
            except queue.Empty:
                if text is not None:
                    flush()
                watch()
                continue
            if isinstance(item, Completion):
                if text is not None:
                    flush()
                return item
            raise item

    def close(self) -> None:
        """Stop the worker once it has finished what it runs."""
        if self._worker is not None:
            self._jobs.put(None)
            self._worker.join(timeout=60)
            self._worker = None

    # --- the worker ------------------------------------------------------------------------------
    def _submit(self, job: _Job) -> None:
        with self._count_lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._work, name="docqa-serve-engine", daemon=True)
                self._worker.start()
        self._jobs.put(job)

    def _work(self) -> None:
        from ..engine.batch import take_all

        session = self.engine.batch_session()
        active: dict = {}  # Request -> _Job
        while True:
            jobs = take_all(self._jobs, wait=not session.has_work)
            for job in jobs:
                if job is None:
                    for req in active:
                        req.cancel()
                    return
                if job.cancelled:
                    continue
                if self._runs_alone(session, len(job.ids)):
                    self._run_alone(job)
                    continue
                o = job.options
                job.request = session.add(job.ids, o["max_tokens"], temperature=o["temperature"], top_p=o["top_p"],
                                          seed=o["seed"])
                if job.cancelled:  # cancelled while it was being added
                    job.request.cancel()
                active[job.request] = job
            if not session.has_work:
                continue
            try:
                with self.lock:
                    ended = session.step()
            except Exception as e:  # the engine failed: every request in the batch gets the error
                for req, job in active.items():
                    session.abort(req)
                    job.out.put(e)
                active.clear()
                continue
            for req in ended:
                r = req.result
                active.pop(req).out.put(Completion(r.text, "stop" if r.stop_reason == "stop" else "length",
                                                   r.prompt_tokens, len(r.token_ids), req.cached_tokens or 0))

    def _run_alone(self, job: _Job) -> None:
        """A long prompt: through the prefix cache (its document's KV prefilled once), alone."""
        o = job.options

        def on_token(token, _delta):
            if job.cancelled:
                raise ClientGone()
            if token is not None:
                job.tokens.append(token)

        try:
            with self.lock:
                cache = self._cache()
                ids = job.ids
                state, cached = cache.get_state(SERVE_KEY, ids, capacity=len(ids) + o["max_tokens"] + 16)
                result = self.engine.generate(ids[cached:], max_new_tokens=o["max_tokens"], state=state,
                                              temperature=o["temperature"], top_p=o["top_p"], seed=o["seed"],
                                              on_token=on_token, on_prefill=lambda _d, _t: on_token(None, ""))
                cache.save(SERVE_KEY, ids, state)
        except Exception as e:  # ClientGone included: nobody reads it then
            job.out.put(e)
            return
        job.out.put(Completion(result.text, "stop" if result.stop_reason == "stop" else "length", len(ids),
                               len(result.token_ids), cached))

    def _runs_alone(self, session, n_tokens: int) -> bool:
        """Whether a prompt goes alone through the prefix cache: past what the CUDA batch takes
        (`BatchSession.max_prompt_tokens`), or, where requests run one after another anyway,
        past one KV segment (the prefix cache then keeps its document across requests)."""
        from ..engine.batch import BatchSession

        if isinstance(session, BatchSession):
            return n_tokens > session.max_prompt_tokens
        return n_tokens > self._segment_size()

    def _segment_size(self) -> int:
        from ..engine.settings import EngineSettings

        return (self.prefix_cache.settings if self.prefix_cache is not None else EngineSettings()).segment_size

    def _cache(self):
        if self.prefix_cache is None:
            self.prefix_cache = self.engine.prefix_cache  # the engine's own, shared with `ask --read-all`
        return self.prefix_cache

class _Watch:
    """Raises ClientGone once `gone()` says so, asking it at most every CANCEL_CHECK_S."""

    def __init__(self, gone):
        self.gone, self.next = gone, 0.0

    def __call__(self) -> None:
        now = time.monotonic()
        if now >= self.next:
            self.next = now + CANCEL_CHECK_S
            if self.gone():
                raise ClientGone()


def _messages(body: dict) -> list[dict[str, str]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise RequestError("'messages' must be a non-empty list")
    out = []
    for m in msgs:
        if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant"):
            raise RequestError("each message needs a role of system, user or assistant")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text is understood
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise RequestError("message content must be text")
        out.append({"role": m["role"], "content": content})
    return out


def _options(body: dict) -> dict:
    if body.get("n", 1) != 1:
        raise RequestError("only n=1 is supported")
    if body.get("stop"):
        raise RequestError("'stop' sequences are not supported; the model stops at its end-of-turn token")
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 256
    if not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise RequestError(f"max_tokens must be a whole number from 1 to {MAX_TOKENS_LIMIT}")
    try:
        temperature = float(body.get("temperature") or 0.0)
        top_p = float(body.get("top_p") if body.get("top_p") is not None else 1.0)
    except (TypeError, ValueError):
        raise RequestError("temperature and top_p must be numbers") from None
    seed = body.get("seed")
    return dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                seed=seed if isinstance(seed, int) else None)


class Handler(BaseHTTPRequestHandler):
    server: "Server"
    server_version = "docqa-serve"
    timeout = 300  # seconds a client may stall while sending its request or reading the answer

    def log_message(self, format, *args):  # one line per request, only when asked for
        if self.server.log:
            self.server.log(f"{self.address_string()} {format % args}")

    def _json(self, code: int, value: dict) -> None:
        data = json.dumps(value).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, message: str, kind: str = "invalid_request_error") -> None:
        self._json(code, {"error": {"message": message, "type": kind}})

    def _client_gone(self) -> bool:
        """Whether the client closed its end: the socket reads as ended (a pipelined next
        request would read as data)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def do_GET(self):
        if self.path.rstrip("/") in ("/v1/models", "/models"):
            served = self.server.served
            self._json(200, {"object": "list", "data": [
                {"id": served.name, "object": "model", "created": self.server.started, "owned_by": "docqa"}]})
        else:
            self._error(404, f"no such endpoint: GET {self.path}", "not_found_error")

    def _body(self) -> dict:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            raise RequestError("Content-Length must be a whole number of bytes")
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the body stays unread
            raise _TooLarge(f"the request body ({length:,} bytes) exceeds the {MAX_BODY_BYTES:,}-byte limit")
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            raise RequestError("the request body is not JSON") from None
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        return body

    def do_POST(self):
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            return self._error(404, f"no such endpoint: POST {self.path}", "not_found_error")
        try:
            body = self._body()
            messages, options = _messages(body), _options(body)
        except _TooLarge as e:
            return self._error(413, str(e))
        except RequestError as e:
            return self._error(400, str(e))
        cid = "chatcmpl-" + secrets.token_hex(12)
        if body.get("stream"):
            return self._stream(cid, messages, options)
        c = self._complete(lambda: self.server.served.complete(messages, **options, gone=self._client_gone))
        if c is not None:
            self._json(200, {
                "id": cid, "object": "chat.completion", "created": int(time.time()),
                "model": self.server.served.name,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text},
                             "finish_reason": c.finish_reason}],
                "usage": _usage(c),
            })

    def _complete(self, run, started: list | None = None) -> Completion | None:
        """run() -> its Completion; None when it failed, the failure answered: 400 (a bad
        prompt), 503 (busy), nothing (the client left), or the engine's error — a 500, or an
        event once a stream's headers are sent (`started` not empty)."""
        try:
            return run()
        except RequestError as e:
            self._error(400, str(e))
        except Busy:
            self._busy()
        except ClientGone:
            self.close_connection = True
        except Exception as e:  # the engine failed: the client gets an error, the server lives on
            if not started:
                self._error(500, f"generation failed: {e}", "server_error")
            else:
                try:
                    self.wfile.write(b"data: " + json.dumps({"error": {"message": f"generation failed: {e}",
                                                                       "type": "server_error"}}).encode() + b"\n\n")
                except OSError:
                    pass
        return None

    def _busy(self) -> None:
        self.close_connection = True
        data = json.dumps({"error": {"message": f"the server has {self.server.served.max_waiting} requests waiting; "
                                                "try again later", "type": "server_busy"}}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Retry-After", "1")
        self.end_headers()
        self.wfile.write(data)

    def _stream(self, cid: str, messages, options) -> None:
        base = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                "model": self.server.served.name}
        started = []

        def write(data: bytes) -> None:
            try:
                self.wfile.write(data)
                self.wfile.flush()
            except OSError:
                raise ClientGone() from None

        def send(choice: dict, **extra) -> None:
            write(b"data: " + json.dumps(base | {"choices": [choice]} | extra).encode() + b"\n\n")

        def start() -> None:  # accepted: the answer streams from here
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.end_headers()
            started.append(True)
            send({"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None})

        def run() -> Completion:
            c = self.server.served.complete(
                messages, **options, on_start=start, gone=self._client_gone,
                on_delta=lambda d: send({"index": 0, "delta": {"content": d}, "finish_reason": None}))
            send({"index": 0, "delta": {}, "finish_reason": c.finish_reason}, usage=_usage(c))
            write(b"data: [DONE]\n\n")
            return c

        self._complete(run, started)


def _usage(c: Completion) -> dict:
    return {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
            "total_tokens": c.prompt_tokens + c.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": c.cached_tokens}}


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = MAX_WAITING  # the listen backlog: clients connecting at once wait there, never reset

    def __init__(self, served: ServedEngine, host: str = "127.0.0.1", port: int = 0, log=None):
        super().__init__((host, port), Handler)
        self.served, self.log, self.started = served, log, int(time.time())

    def server_close(self) -> None:
        super().server_close()
        self.served.close()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"


def make_server(model: str | None = None, *, device: str | None = None, host: str = "127.0.0.1", port: int = 0,
                log=None) -> Server:
    """A server for the engine of `model` (a checkpoint; None: DOCQA_MODEL, else the default)."""
    from . import config
    from .remote import is_remote
    from .service import Runtime

    spec = config.model_spec(model)
    if is_remote(spec):
        raise DocqaError("docqa serve serves the embedded engine; give it a checkpoint, not an openai: server")
    engine = Runtime().engine(spec, device).engine
    try:
        return Server(ServedEngine(engine, Path(str(engine.checkpoint.path)).name), host, port, log)
    except OSError as e:
        raise DocqaError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def register(app) -> None:
    """Mount `docqa serve` on the CLI."""
    
    @app.command()
    @cli_errors
    def serve(
        port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port (0: any free one).")] = 8321,
        host: Annotated[str, typer.Option("--host", help="Address to listen on; other machines can reach "
                                          "anything but 127.0.0.1.")] = "127.0.0.1",
        model: Annotated[Optional[str], typer.Option("--model", help="GGUF file or HF checkpoint dir "
                                                     "[default: $DOCQA_MODEL, else SmolLM2-135M-Instruct]")] = None,
        device: Annotated[Optional[str], typer.Option("--device", help="cpu, cuda, cuda:N or auto")] = None,
        verbose: Annotated[bool, typer.Option("--verbose", help="Log each request on stderr.")] = False,
    ) -> None:
        """Serve the embedded engine as an OpenAI-compatible API (/v1/chat/completions, /v1/models).

        Streams with "stream": true; long prompts that repeat a cached prefix prefill only the
        rest. Stop with Ctrl-C.

        Example: docqa serve --port 8321 & docqa ask contract.pdf "Which law governs?" --model openai:http://127.0.0.1:8321/v1
        """
        server = make_server(model, device=device, host=host, port=port,
                             log=(lambda line: err.print(line)) if verbose else None)
        err.print(f"serving {server.served.name} at {server.url} (Ctrl-C stops)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
