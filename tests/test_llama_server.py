"""`docqa ask --model openai:…` against a real llama.cpp `llama-server` on the default GGUF
(slow: it starts a server process). llama.cpp is built outside the project as
bench/llamacpp.py describes (`cmake --build build --target llama-server`); the binary is
found through `LLAMA_SERVER`, else under /tmp/llamacpp*/. The server binds 127.0.0.1 on a
free port and is stopped when the test ends."""

import glob
import json
import os
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
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_client_streams_from_llama_server(llama_server):
    remote = RemoteModel.parse(f"openai:{llama_server}").resolved()
    assert remote.model  # llama-server lists the loaded GGUF
    pieces = []
    text = remote.chat([{"role": "user", "content": "Name the capital of France in one word."}], max_tokens=16,
                       on_token=pieces.append)
    assert text and "".join(pieces) == text and "paris" in text.lower()


def test_ask_through_llama_server(llama_server, tmp_path):
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
    print(f"llama-server ask: status {res['status']}, {len(res['citations'])} citations, {wall:.1f} s")
