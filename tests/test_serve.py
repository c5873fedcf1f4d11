"""`docqa serve` and the OpenAI-compatible client, over localhost only: the server is started
on a free 127.0.0.1 port inside the test and shut down after it.

The reference for what the server returns is the engine itself: greedy text from
`Engine.generate` on the same chat prompt must come back unchanged through HTTP, streamed or
not; and `docqa ask --model openai:…` against it must show only citations that re-check
against the sample contract's source lines."""

import contextlib
import json
import socket
import threading
import urllib.error
import urllib.request

import pytest
from typer.testing import CliRunner

from docqa.app.service import Runtime
from docqa.app.cli import app
from docqa.app.remote import ModelServerError, RemoteModel
from docqa.app.serve import ServedEngine, Server
from docqa.fixtures.make_pdf import write_sample_contract_pdf
from docqa.pipelines.textnorm import normalize

MESSAGES = [{"role": "system", "content": "You answer in one short sentence."},
            {"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def engine():
    return Runtime().engine(None).engine


@contextlib.contextmanager
def serving(engine, cache, *, start: bool = True, **limits):
    """`docqa serve`'s server for `engine` on a free 127.0.0.1 port, stopped on exit. start=False:
    it listens but accepts nothing until `srv.thread.start()`."""
    srv = Server(ServedEngine(engine, "smollm2-test", cache, **limits), "127.0.0.1", 0)
    thread = srv.thread = threading.Thread(target=srv.serve_forever, daemon=True)
    if start:
        thread.start()
    try:
        yield srv
    finally:
        if thread.is_alive():
            srv.shutdown()
        srv.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def server(engine, tmp_path_factory):
    from docqa.engine.prefix_cache import PrefixCache

    with serving(engine, PrefixCache.for_engine(engine, cache_dir=tmp_path_factory.mktemp("kv"))) as srv:
        yield srv


def _post(url, body, timeout=120):
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.load(r)


def _reference(engine, messages, n):
    ids = engine.chat_prompt(messages[-1]["content"], system=messages[0]["content"])
    return engine.generate(ids, max_new_tokens=n).text, len(ids)


def test_models_lists_the_served_engine(server):
    assert RemoteModel.parse(f"openai:{server.url}").models() == ["smollm2-test"]
    assert RemoteModel.parse(f"openai:{server.url}").resolved().model == "smollm2-test"


def test_streamed_and_plain_completions_equal_the_engine(server, engine):
    text, n_prompt = _reference(engine, MESSAGES, 24)
    pieces = []
    got = RemoteModel.parse(f"openai:{server.url}#smollm2-test").chat(MESSAGES, max_tokens=24, on_token=pieces.append)
    assert got == text and len(pieces) > 1  # streamed in pieces, joined to the engine's text
    plain = _post(server.url, {"model": "smollm2-test", "messages": MESSAGES, "max_tokens": 24})
    assert plain["choices"][0]["message"]["content"] == text
    assert plain["usage"]["prompt_tokens"] == n_prompt


def test_32_concurrent_clients_are_all_answered_as_one_at_a_time(server, engine):
    """32 clients at once (four prompts, eight each): none refused or reset, and each gets the
    text the engine gives that prompt on its own."""
    prompts = [[{"role": "user", "content": f"Name a colour{'!' * i}"}] for i in range(4)]
    want = [engine.generate(server.served.prompt_ids(p), max_new_tokens=2).text for p in prompts]
    got, errors = {}, []

    def one(i):
        try:
            got[i] = _post(server.url, {"messages": prompts[i % 4], "max_tokens": 2}, timeout=600)
        except Exception as e:  # a reset or refused connection
            errors.append(repr(e))

    clients = [threading.Thread(target=one, args=(i,)) for i in range(32)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    assert not errors and len(got) == 32
    assert all(got[i]["choices"][0]["message"]["content"] == want[i % 4] for i in range(32))


def test_clients_connecting_while_the_server_is_busy_wait_in_its_backlog(engine):
    """Until the server gets to them, connecting clients wait in the listening socket's backlog:
    it holds as many as the server queues (a backlog of 5 left the rest unanswered)."""
    with serving(engine, None, start=False) as srv:
        port = srv.server_address[1]
        socks = []
        try:
            for _ in range(32):
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
                socks[-1].sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            srv.thread.start()
            for s in socks:
                assert s.makefile("rb").readline().startswith(b"HTTP/1.0 200")
        finally:
            for s in socks:
                s.close()


def _raw_request(port: int, body: bytes, length: int | None = None) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length) + body)
    return s


def test_a_huge_body_is_refused_before_it_is_read(server):
    """A 50 MB body is answered 413 from its Content-Length alone (before, the server read and
    parsed all of it, and a prompt that size held the engine for minutes)."""
    with _raw_request(server.server_address[1], b"{", length=50_000_000) as s:
        head = s.makefile("rb").read()
    assert head.startswith(b"HTTP/1.0 413") and b"exceeds" in head


def test_a_prompt_longer_than_the_context_is_refused(engine):
    with serving(engine, None, max_context=64) as srv:
        with pytest.raises(urllib.error.HTTPError) as e:
            _post(srv.url, {"messages": [{"role": "user", "content": "word " * 80}], "max_tokens": 4})
        assert e.value.code == 400 and "context" in json.load(e.value)["error"]["message"]
        with pytest.raises(urllib.error.HTTPError) as e:  # the prompt fits, not with its answer
            _post(srv.url, {"messages": MESSAGES, "max_tokens": 60})
        assert e.value.code == 400


def _wait_for(condition, seconds: float = 10.0) -> bool:
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_work_is_cancelled_when_the_client_goes_away(engine):
    """A client that closes its connection — while its answer is computed, or while it waits
    for the engine — frees the engine at once; past max_waiting a request is answered 503."""
    body = json.dumps({"messages": MESSAGES, "max_tokens": 8192, "temperature": 1.5, "seed": 1}).encode()
    with serving(engine, None, max_waiting=1) as srv:
        served, port = srv.served, srv.server_address[1]
        # running: sampling at a high temperature, 8192 tokens would take minutes on the CPU
        s = _raw_request(port, body)
        assert _wait_for(served.lock.locked)
        s.close()
        assert _wait_for(lambda: not served.lock.locked(), 5), "the engine kept working for a client that left"
        # waiting: the engine is held here; one request waits (max_waiting), the next is refused
        with served.lock:
            s = _raw_request(port, body)
            assert _wait_for(lambda: served._queued == 1)
            with pytest.raises(urllib.error.HTTPError) as e:
                _post(srv.url, {"messages": MESSAGES, "max_tokens": 2}, timeout=30)
            assert e.value.code == 503
            s.close()
            assert _wait_for(lambda: served._queued == 0, 5)


def test_bad_requests_are_refused_with_a_reason(server):
    with pytest.raises(urllib.error.HTTPError) as e:
        _post(server.url, {"messages": []})
    assert e.value.code == 400 and "messages" in json.load(e.value)["error"]["message"]
    with pytest.raises(ModelServerError, match="answered 400"):
        RemoteModel(server.url, "x").chat([{"role": "tool", "content": "hi"}])


@pytest.mark.slow  # two ~2.5K-token prefills through the sparse state: minutes on a loaded 2-core CPU
def test_long_prompt_reuses_its_cached_prefix(server, engine):
    """A second prompt with the same long start prefills only the part after its cached
    segments, and answers as the first one would have without the cache."""
    doc = " ".join(f"Clause {i}: the supplier shall deliver item {i} within {i % 30 + 1} days." for i in range(150))
    first = [{"role": "user", "content": doc + "\n\nQuestion: when is item 7 delivered?"}]
    second = [{"role": "user", "content": doc + "\n\nQuestion: when is item 9 delivered?"}]
    n = len(server.served.prompt_ids(first))
    assert n > 2048, n  # longer than one segment, or nothing is cached
    a = _post(server.url, {"messages": first, "max_tokens": 6}, timeout=900)
    b = _post(server.url, {"messages": second, "max_tokens": 6}, timeout=900)
    assert a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] >= 2048
    # The same second question on a fresh sparse state (no cache) gives the same text.
    fresh = engine.generate(server.served.prompt_ids(second), max_new_tokens=6,
                            state=server.served.prefix_cache.new_state())
    assert b["choices"][0]["message"]["content"] == fresh.text


@pytest.fixture(scope="module")
def ingested(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ask")
    pdf = write_sample_contract_pdf(tmp / "sample_contract.pdf")
    db = tmp / "docqa.db"
    r = CliRunner().invoke(app, ["ingest", str(pdf), "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output
    return pdf, db


def test_ask_through_docqa_serve(server, ingested):
    from docqa.app.store import Store

    pdf, db = ingested
    r = CliRunner().invoke(app, ["ask", str(pdf), "How long do the confidentiality obligations survive?",
                                 "--db", str(db), "--json", "--max-tokens", "64", "--model", f"openai:{server.url}"])
    assert r.exit_code == 0, r.output
    res = json.loads(r.stdout)
    assert res["model"] == f"openai:{server.url}#smollm2-test"
    assert res["status"] in ("answered", "not_found", "unsupported") and res["evidence"]
    doc = Store(db).get_document(res["evidence"][0]["doc_id"])
    for c in res["citations"] + ((res["draft"] or {}).get("citations") or []):
        if c["verified"]:  # on its lines, as the source PDF has them
            assert c["supports"] in (True, False)
            assert normalize(c["quote"]) in normalize(doc.lines_text(c["page"], c["line_start"], c["line_end"]))
    if res["status"] == "answered":
        assert any(c["supports"] for c in res["citations"])


def test_a_withheld_server_answer_keeps_its_draft(server, ingested):
    """Issue 28: a model server's answer that is not shown was lost (`draft` null). The served
    default model's reply to this question cites nothing that verifies: it is withheld, and its
    whole text is the draft, in --json and under --show-draft."""
    pdf, db = ingested
    args = ["ask", str(pdf), "Which law governs?", "--db", str(db), "--max-tokens", "48",
            "--model", f"openai:{server.url}"]
    res = json.loads(CliRunner().invoke(app, args + ["--json"]).stdout)
    assert res["status"] in ("unsupported", "not_found") and res["citations"] == []
    draft = res["draft"]["answer"]
    assert draft.strip() and "not found" not in draft.lower()
    r = CliRunner().invoke(app, args + ["--show-draft"])
    assert r.exit_code == 0, r.output
    shown = r.stdout[r.stdout.index("withheld draft (not an answer):"):]
    assert " ".join(draft.split())[:60] in " ".join(shown.split())


def test_server_down_is_one_line_error(ingested):
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pdf, db = ingested
    r = CliRunner().invoke(app, ["ask", str(pdf), "Which law governs?", "--db", str(db),
                                 "--model", f"openai:http://127.0.0.1:{port}/v1#m"], env={"DOCQA_DEBUG": "0"})
    assert r.exit_code == 1
    # progress lines (steps, when stderr is not a terminal) may come first; the error is one line, the last
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error:")]
    assert errors == lines[-1:] and f"127.0.0.1:{port}" in errors[0] and "not reachable" in errors[0]
    assert all(not ln.startswith("Traceback") for ln in lines)


def test_docqa_model_environment_names_the_server(server, ingested):
    pdf, db = ingested
    r = CliRunner().invoke(app, ["ask", str(pdf), "Which law governs?", "--db", str(db), "--json",
                                 "--max-tokens", "32"], env={"DOCQA_MODEL": f"openai:{server.url}#smollm2-test"})
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["model"] == f"openai:{server.url}#smollm2-test"


def test_review_through_docqa_serve(server, ingested, tmp_path):
    pdf, db = ingested
    checklist = tmp_path / "one.yaml"
    checklist.write_text("name: one\ndescription: one item\nitems:\n  - id: law\n    question: Which law governs?\n"
                         "    type: text\n")
    r = CliRunner().invoke(app, ["review", str(pdf), "--checklist", str(checklist), "--db", str(db), "--json",
                                 "--max-tokens", "32", "--model", f"openai:{server.url}#smollm2-test"])
    assert r.exit_code == 0, r.output
    from docqa.app.runs import list_runs
    from docqa.app.store import Store

    with Store(db) as store:
        (run,) = [x for x in list_runs(store) if x.kind == "review"]
    assert run.model == f"openai:{server.url}#smollm2-test" and run.item_id == "law"


def test_read_all_through_docqa_serve_prefills_only_the_question_again(engine, tmp_path):
    """`ask --read-all --model openai:…`: the whole document goes to the server in one prompt,
    document first; the server's prefix cache serves the document to the second question, and the answer is checked against the document as any other. (A server
    of its own with 256-token segments, so a short document already spans several.)"""
    from docqa.app.store import Store
    from docqa.engine.prefix_cache import PrefixCache

    cache = PrefixCache.for_engine(engine, engine.sparse_settings(segment_size=256), cache_dir=tmp_path / "kv")
    clause = ("{n}. The Supplier shall deliver the Goods listed in Schedule {n} within {d} days of each "
              "purchase order, and the Customer shall pay each invoice within {p} days of receipt.\n")
    doc = tmp_path / "long.txt"
    doc.write_text("".join(clause.format(n=i, d=10 + i % 20, p=30 + i % 3 * 15) for i in range(1, 16)))
    db = tmp_path / "docqa.db"
    assert CliRunner().invoke(app, ["ingest", str(doc), "--db", str(db), "--json"]).exit_code == 0
    runs = []
    with serving(engine, cache) as srv:
        for q in ("Within how many days must invoices under Schedule 7 be paid?",
                  "Within how many days are the Goods of Schedule 12 delivered?"):
            r = CliRunner().invoke(app, ["ask", str(doc), q, "--read-all", "--db", str(db), "--json",
                                         "--max-tokens", "24", "--model", f"openai:{srv.url}#smollm2-test"])
            assert r.exit_code == 0, r.output
            runs.append(json.loads(r.stdout))
    # the second prompt's document came from the cache: its segments (CPU) or the live state (GPU)
    assert cache.hits_memory >= 2 or cache.hits_live == 1
    assert all(run["timings"]["first_token_s"] > 0 for run in runs)
    stored = Store(db).get_document(runs[0]["evidence"][0]["doc_id"])
    for run in runs:
        assert run["status"] in ("answered", "not_found", "unsupported")
        for c in run["citations"]:
            if c["verified"]:
                assert normalize(c["quote"]) in normalize(stored.lines_text(c["page"], c["line_start"], c["line_end"]))
