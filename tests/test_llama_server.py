"""`docqa ask --model openai:…` against a real llama.cpp `llama-server` on the default GGUF
(slow: it starts a server process). llama.cpp is built outside the project by
`.venv/bin/python bench/llamacpp.py --build /tmp/llamacpp-build`; the binary is found
through `LLAMA_SERVER`, else under /tmp/llamacpp*/. The server binds 127.0.0.1 on a
free port and is stopped when the test ends. `-s` shows the figures the README quotes: the ask's
wall time, status and citations, and the server's own prompt/eval tokens per second."""

import glob
import json
import os
import re
import socket
import subprocess
import time
import urllib.request

import pytest
from typer.testing import CliRunner

from docqa.app.cli import app
from docqa.app.remote import RemoteModel
from docqa.fixtures.make_pdf import write_sample_contract_pdf
from docqa.pipelines.textnorm import normalize

pytestmark = pytest.mark.slow


def _binary() -> str | None:
    env = os.environ.get("LLAMA_SERVER")
    if env:
        return env
    found = sorted(glob.glob("/tmp/llamacpp*/**/build/bin/llama-server", recursive=True))
    return found[-1] if found else None


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    binary = _binary()
    if not binary or not os.access(binary, os.X_OK):
        pytest.skip("needs a llama.cpp llama-server binary (LLAMA_SERVER, or built as bench/llamacpp.py says)")
    from docqa.engine.default_model import default_model_path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path_factory.mktemp("llama") / "server.log"
    proc = subprocess.Popen([binary, "-m", str(default_model_path()), "--host", "127.0.0.1", "--port", str(port),
                             "-c", "4096", "-t", "1", "--no-webui"],
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail("llama-server did not start: " + log.read_text()[-500:])
            time.sleep(1)
        yield url, log
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _server_timings(log) -> str:
    """The server's figures for its last request, from its log ("prompt eval time = ... tokens
    per second" and "eval time = ..."), as one line."""
    found = re.findall(r"(prompt eval|eval) time = +([\d.]+) ms / +(\d+) tokens .*?([\d.]+) tokens per second",
                       log.read_text())
    last = {kind: (ms, n, tps) for kind, ms, n, tps in found}
    return "; ".join(f"{kind} {n} tokens in {float(ms) / 1e3:.2f} s, {float(tps):.1f} tok/s"
                     for kind, (ms, n, tps) in last.items())


def test_client_streams_from_llama_server(llama_server):
    """The client's streamed text, joined from its pieces, is the text the server gives for the
    same greedy request without streaming (read here with urllib, not through the client)."""
    url, _ = llama_server
    remote = RemoteModel.parse(f"openai:{url}").resolved()
    assert remote.model  # llama-server lists the loaded GGUF
    messages = [{"role": "user", "content": "Name the capital of France in one word."}]
    pieces = []
    text = remote.chat(messages, max_tokens=16, on_token=pieces.append)
    body = json.dumps({"model": remote.model, "messages": messages, "max_tokens": 16, "temperature": 0.0,
                       "stream": False}).encode()
    req = urllib.request.Request(f"{url}/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        whole = json.load(r)["choices"][0]["message"]["content"]
    assert len(pieces) > 1 and "".join(pieces) == text == whole


def test_ask_through_llama_server(llama_server, tmp_path, monkeypatch):
    llama_server, log = llama_server
    replies = []  # what the server wrote, for the figures printed below
    chat = RemoteModel.chat
    monkeypatch.setattr(RemoteModel, "chat", lambda self, *a, **k: replies.append(chat(self, *a, **k)) or replies[-1])
    pdf = write_sample_contract_pdf(tmp_path / "sample_contract.pdf")
    db = tmp_path / "docqa.db"
    assert CliRunner().invoke(app, ["ingest", str(pdf), "--db", str(db)]).exit_code == 0
    from docqa.app.store import Store

    t = time.perf_counter()
    r = CliRunner().invoke(app, ["ask", str(pdf), "How long do the confidentiality obligations survive?", "--db",
                                 str(db), "--json", "--max-tokens", "96", "--model", f"openai:{llama_server}"])
    wall = time.perf_counter() - t
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["model"].startswith(f"openai:{llama_server}#")
    doc = Store(db).get_document(res["evidence"][0]["doc_id"])
    for c in res["citations"] + ((res["draft"] or {}).get("citations") or []):
        if c["verified"]:
            assert normalize(c["quote"]) in normalize(doc.lines_text(c["page"], c["line_start"], c["line_end"]))
    # The fixture's clause: "... shall survive for five (5) years after termination".
    assert "five" in replies[-1].lower() or "5" in replies[-1]
    verified = sum(c["verified"] for c in res["citations"])
    print(f"\nllama-server ask: {wall:.1f} s wall, status {res['status']}, {len(res['citations'])} citations "
          f"({verified} verified), answer {res['answer']!r}\nllama-server: {_server_timings(log)}\n"
          f"the server's reply: {replies[-1][:300]!r}")
