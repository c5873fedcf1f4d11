"""A client for OpenAI-compatible chat servers: Ollama, llama.cpp's `llama-server`, vLLM, `docqa serve`.

`--model openai:http://HOST:PORT/v1#MODEL` (or `DOCQA_MODEL` set to the same) names one; `#MODEL`
may be left out when the server serves a single model (its first `/v1/models` entry is used).
A bearer token for servers started with an API key is read from `DOCQA_OPENAI_API_KEY`.

Only the standard library: one POST to `/chat/completions` per answer, streamed as server-sent
events (`stream: true`) so tokens show as they come. Any failure to reach the server or to
read its reply is one `ModelServerError` line naming the URL; the socket timeout bounds every
wait (connecting, and each read while the server thinks).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from . import config
from .errors import DocqaError

PREFIX = "openai:"
# Seconds any one wait may take: connecting, or the gap between two streamed tokens (a server
# prefilling a long prompt on a CPU may take a while before the first).
TIMEOUT_S = 300.0
# The log-odds a verdict counts for when a server writes "Yes" or "No" but sends no log-probabilities.
VERDICT_LOGODDS = 5.0


class ModelServerError(DocqaError):
    """The model server could not be reached or answered with an error."""


def is_remote(model: str | None) -> bool:
    return bool(model) and model.startswith(PREFIX)


@dataclass(frozen=True)
class RemoteModel:
    """An OpenAI-compatible endpoint: `base_url` ends in `/v1`; `model` None: the server's first."""

    base_url: str
    model: str | None = None
    timeout_s: float = TIMEOUT_S
    api_key: str | None = None

    @classmethod
    def parse(cls, spec: str, *, timeout_s: float = TIMEOUT_S) -> RemoteModel:
        """`openai:http://HOST:PORT/v1#MODEL` -> RemoteModel."""
        if not is_remote(spec):
            raise ModelServerError(f"not an OpenAI-compatible model spec: {spec!r} (expected openai:http://HOST:PORT/v1#MODEL)")
        url, _, model = spec[len(PREFIX):].partition("#")
        if not url.startswith(("http://", "https://")):
            raise ModelServerError(f"model server URL must start with http:// or https://, not {url!r}")
        return cls(url.rstrip("/"), model or None, timeout_s, config.openai_api_key())

    @property
    def name(self) -> str:
        """How runs record the model: the spec it was given, resolved model name included."""
        return f"{PREFIX}{self.base_url}#{self.model or ''}"

    # --- requests --------------------------------------------------------------------------

    def _request(self, path: str, body: dict | None = None):
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base_url + path, data=data, headers=headers,
                                     method="POST" if body is not None else "GET")
        try:
            return urllib.request.urlopen(req, timeout=self.timeout_s)
        except urllib.error.HTTPError as e:
            detail = _error_detail(e)
            raise ModelServerError(f"model server {self.base_url} answered {e.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ModelServerError(f"model server {self.base_url} is not reachable: {reason}") from None

    def models(self) -> list[str]:
        with self._request("/models") as r:
            try:
                return [m["id"] for m in json.load(r).get("data", [])]
            except (ValueError, KeyError, TypeError, AttributeError):
                raise ModelServerError(f"model server {self.base_url}: /models is not an OpenAI model list") from None

    def resolved(self) -> RemoteModel:
        """This endpoint with its model named: the server's first model when none was given."""
        if self.model:
            return self
        names = self.models()
        if not names:
            raise ModelServerError(f"model server {self.base_url} serves no model")
        return RemoteModel(self.base_url, names[0], self.timeout_s, self.api_key)

    def chat(self, messages: list[dict[str, str]], *, max_tokens: int = 256, temperature: float = 0.0,
             on_token: Callable[[str], None] | None = None) -> str:
        """The assistant's reply to `messages`, streamed: `on_token(delta)` for each piece."""
        body = {"model": self.model or "", "messages": messages, "max_tokens": max_tokens,
                "temperature": temperature, "stream": True}
        parts = []
        try:
            with self._request("/chat/completions", body) as r:
                for delta in _stream_deltas(r, self.base_url):
                    parts.append(delta)
                    if on_token:
                        on_token(delta)
        except TimeoutError:
            raise ModelServerError(f"model server {self.base_url} sent nothing for {self.timeout_s:.0f} s") from None
        except OSError as e:  # the connection dropped mid-answer
            raise ModelServerError(f"model server {self.base_url} stopped answering: {e}") from None
        return "".join(parts)

    def yes_no(self, messages: list[dict[str, str]]) -> float:
        """The server's log-odds of "Yes" over "No" as the first word of its reply (a quote's
        verdict, pipelines/answer/support.py): from the reply's top log-probabilities where the
        server sends them (vLLM, llama-server), else ±VERDICT_LOGODDS for the word it wrote."""
        body = {"model": self.model or "", "messages": messages, "max_tokens": 1, "temperature": 0.0,
                "stream": False, "logprobs": True, "top_logprobs": 20}
        try:
            with self._request("/chat/completions", body) as r:
                choice = json.load(r)["choices"][0]
        except TimeoutError:
            raise ModelServerError(f"model server {self.base_url} sent nothing for {self.timeout_s:.0f} s") from None
        except (ValueError, KeyError, IndexError, TypeError):
            raise ModelServerError(f"model server {self.base_url}: the reply is not an OpenAI chat completion") from None
        top = (((choice.get("logprobs") or {}).get("content") or [{}])[0] or {}).get("top_logprobs") or []
        scores = {"yes": [], "no": []}
        for t in top:
            word = str(t.get("token", "")).strip().lower()
            if word in scores and isinstance(t.get("logprob"), (int, float)):
                scores[word].append(math.exp(t["logprob"]))
        if top and (scores["yes"] or scores["no"]):
            # A word missing from the top list is less likely than the least likely listed.
            floor = min(math.exp(t["logprob"]) for t in top if isinstance(t.get("logprob"), (int, float)))
            yes, no = (sum(scores[w]) or floor / 2 for w in ("yes", "no"))
            return math.log(yes) - math.log(no)
        word = ((choice.get("message") or {}).get("content") or "").strip().lower()
        return VERDICT_LOGODDS if word.startswith("yes") else -VERDICT_LOGODDS


def _stream_deltas(r, url: str) -> Iterator[str]:
    """Text pieces of a chat completion: server-sent events, or one JSON body from a server
    that ignores `stream`."""
    if "text/event-stream" not in (r.headers.get("Content-Type") or ""):
        try:
            yield json.load(r)["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError):
            raise ModelServerError(f"model server {url}: the reply is not an OpenAI chat completion") from None
        return
    for raw in r:
        line = raw.decode("utf-8", "replace").strip()
        if not line.startswith("data:"):
            continue  # blank separators, comments, event names
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            raise ModelServerError(f"model server {url}: a streamed event is not JSON: {data[:80]!r}") from None
        if "error" in event:
            raise ModelServerError(f"model server {url}: {_message(event['error'])}")
        for choice in event.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                yield piece


def _message(err) -> str:
    return err.get("message", str(err)) if isinstance(err, dict) else str(err)


def _error_detail(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read() or b"{}")
        return _message(body.get("error", body))[:200]
    except (ValueError, OSError, AttributeError):
        return e.reason or "error"
