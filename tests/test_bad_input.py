"""SPEC §8 through the CLI: every bad file gets one line on stderr naming it, leaves the
database exactly as it was, and does not stop the good files of the same run."""

from __future__ import annotations

import io
import json
import sqlite3
import zipfile
from pathlib import Path

import pytest
from pypdf import PdfReader, PdfWriter
from typer.testing import CliRunner

from docqa.app.cli import EXIT_ERROR, EXIT_NOTHING_INGESTED, app


def make_pdf(pages: list[list[str]]) -> bytes:
    """A minimal, valid PDF with a Helvetica text layer: one text line per string."""
    objects: list[bytes] = []
    kids = " ".join(f"{3 + 2 * i} 0 R" for i in range(len(pages)))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    font_id = 3 + 2 * len(pages)
    for i, lines in enumerate(pages):
        ops = ["BT", "/F1 12 Tf", "14 TL", "72 720 Td"]
        for line in lines:
            escaped = line.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
            ops.append(f"({escaped}) Tj T*")
        ops.append("ET")
        stream = "\n".join(ops).encode("latin-1")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {4 + 2 * i} 0 R"
            f" /Resources << /Font << /F1 {font_id} 0 R >> >> >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for n, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % n + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for off in offsets:
        out.write(b"%010d 00000 n \n" % off)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\n" % (len(objects) + 1))
    out.write(b"startxref\n%d\n%%%%EOF\n" % xref)
    return out.getvalue()


def encrypt(pdf: bytes, user_password: str) -> bytes:
    writer = PdfWriter(clone_from=PdfReader(io.BytesIO(pdf)))
    writer.encrypt(user_password=user_password, owner_password="owner-secret", algorithm="AES-256")
    buf = io.BytesIO()
    writer.write(buf)
    return buf.getvalue()


GOOD_LINES = ["Master Services Agreement", "The Supplier shall deliver the goods."]


def counts(db: Path) -> dict[str, int]:
    con = sqlite3.connect(db)
    try:
        names = [r[0] for r in con.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'")]
        return {n: con.execute(f"SELECT count(*) FROM [{n}]").fetchone()[0] for n in names}
    finally:
        con.close()


def run(args: list[str], **env) -> object:
    return CliRunner().invoke(app, args, env={"DOCQA_DEBUG": "1", **env})


@pytest.fixture
def bad_files(tmp_path: Path) -> dict[str, Path]:
    good_pdf = make_pdf([GOOD_LINES])
    files = {
        "password.pdf": encrypt(good_pdf, "open-sesame"),
        "truncated.pdf": good_pdf[: len(good_pdf) // 2],
        "corrupt.pdf": b"%PDF-1.4\n" + bytes(range(256)) * 8 + b"\n%%EOF\n",
        "zero.pdf": b"",
        "no_text.pdf": make_pdf([[]]),
        "letter.docx": _docx_bytes(),
        "latin_garbage.txt": _undecodable_bytes(),
        "billion_laughs.html": _billion_laughs(),
        "huge.txt": b"plain text line\n" * 4000,  # 64 000 bytes; the test's limit is 50 000
    }
    paths = {}
    for name, data in files.items():
        p = tmp_path / "bad" / name
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(data)
        paths[name] = p
    return paths


def _docx_bytes() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("word/document.xml", "<w:document/>")
    return buf.getvalue()


def _undecodable_bytes() -> bytes:
    # Bytes a text file in no encoding would hold: invalid UTF-8, no NULs, no BOM.
    import random

    rng = random.Random(7)
    return bytes(rng.choice(range(0x80, 0x100)) for _ in range(3000))


def _billion_laughs() -> bytes:
    ents = ['<!ENTITY lol "lol">'] + [
        f'<!ENTITY lol{i} "{("&lol%s;" % ("" if i == 1 else i - 1)) * 10}">' for i in range(1, 10)
    ]
    return (
        '<?xml version="1.0"?>\n<!DOCTYPE html [\n' + "\n".join(ents) + "\n]>\n"
        '<html xmlns="http://www.w3.org/1999/xhtml"><body><h1>Title</h1><p>&lol9;</p></body></html>'
    ).encode()


def test_each_bad_file_one_line_others_ingest_db_unchanged(tmp_path, bad_files):
    db = tmp_path / "t.db"
    good = tmp_path / "good.md"
    good.write_text("# Terms\n\nThe Supplier shall deliver the goods.\n", encoding="utf-8")
    res = run(["ingest", str(good), "--db", str(db)])
    assert res.exit_code == 0, res.stderr
    before = counts(db)

    second_good = tmp_path / "second.pdf"
    second_good.write_bytes(make_pdf([GOOD_LINES, ["Page two text of the agreement."]]))
    args = ["ingest", *map(str, bad_files.values()), str(second_good), "--db", str(db), "--json"]
    res = run(args, DOCQA_MAX_FILE_BYTES="50000")
    assert res.exit_code == EXIT_ERROR, res.stderr
    err_lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(err_lines) == len(bad_files), res.stderr
    for name, path in bad_files.items():
        mine = [ln for ln in err_lines if str(path) in ln]
        assert len(mine) == 1, (name, res.stderr)
    assert "Traceback" not in res.stderr

    reasons = {Path(r["path"]).name: r["error"] for r in json.loads(res.stdout) if "error" in r}
    assert set(reasons) == set(bad_files)
    assert "password" in reasons["password.pdf"]
    assert "truncated" in reasons["truncated.pdf"] or "corrupt" in reasons["truncated.pdf"]
    assert "empty" in reasons["zero.pdf"]
    assert "no text layer" in reasons["no_text.pdf"]
    assert "unsupported file type '.docx'" in reasons["letter.docx"]
    assert "UTF-8" in reasons["latin_garbage.txt"]
    assert "entity" in reasons["billion_laughs.html"]
    assert "too large" in reasons["huge.txt"]

    after = counts(db)
    # Exactly one more document (the good PDF): its rows, and nothing from the bad files.
    assert after["documents"] == before["documents"] + 1
    assert after["pages"] == before["pages"] + 2
    con = sqlite3.connect(db)
    paths = {r[0] for r in con.execute("SELECT path FROM document_paths")}
    con.close()
    assert not paths & {str(p.resolve()) for p in bad_files.values()}


def test_only_bad_files_exit_nothing_ingested_and_db_untouched(tmp_path, bad_files):
    db = tmp_path / "t.db"
    good = tmp_path / "good.md"
    good.write_text("# One\n\nSome text.\n", encoding="utf-8")
    assert run(["ingest", str(good), "--db", str(db)]).exit_code == 0
    before = counts(db)
    res = run(["ingest", str(bad_files["corrupt.pdf"]), str(bad_files["password.pdf"]),
               "--db", str(db)])
    assert res.exit_code == EXIT_NOTHING_INGESTED
    assert len(res.stderr.strip().splitlines()) == 2
    assert counts(db) == before


def test_empty_user_password_pdf_opens_normally(tmp_path):
    p = tmp_path / "filing.pdf"
    p.write_bytes(encrypt(make_pdf([GOOD_LINES]), ""))
    db = tmp_path / "t.db"
    res = run(["ingest", str(p), "--db", str(db), "--json"])
    assert res.exit_code == 0, res.stderr
    (doc,) = json.loads(res.stdout)
    res = run(["show", doc["doc_id"], "--page", "1", "--json", "--db", str(db)])
    # pipelines/ingest/pdf.py's documented line rule over pypdf's own extraction.
    text = PdfReader(p, password="").pages[0].extract_text()
    expected = [ln.rstrip() for ln in text.splitlines() if ln.rstrip()]
    assert expected == GOOD_LINES
    assert [ln["text"] for ln in json.loads(res.stdout)["lines"]] == expected


def test_external_entity_never_resolved(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-CONTENT", encoding="utf-8")
    page = tmp_path / "xxe.html"
    page.write_text(
        f'<?xml version="1.0"?>\n<!DOCTYPE html [<!ENTITY xxe SYSTEM "file://{secret}">]>\n'
        '<html xmlns="http://www.w3.org/1999/xhtml"><body><h1>Notice</h1>'
        "<p>Before &xxe; after.</p></body></html>",
        encoding="utf-8",
    )
    db = tmp_path / "t.db"
    res = run(["ingest", str(page), "--db", str(db), "--json"])
    # Refusing the file and ingesting it without the entity are both safe; leaking is not.
    assert res.exit_code in (0, EXIT_NOTHING_INGESTED), res.stderr
    assert "TOP-SECRET" not in res.stdout
    con = sqlite3.connect(db)
    texts = " ".join(r[0] for r in con.execute("SELECT text FROM pages"))
    con.close()
    assert "TOP-SECRET" not in texts


def test_missing_file_and_unknown_doc_are_one_line(tmp_path):
    db = tmp_path / "t.db"
    res = run(["ingest", str(tmp_path / "nope.pdf"), "--db", str(db)])
    assert res.exit_code == EXIT_NOTHING_INGESTED
    assert res.stderr.strip().count("\n") == 0 and "no such file" in res.stderr
    res = run(["show", "deadbeef", "--db", str(db)])
    assert res.exit_code == EXIT_ERROR
    assert res.stderr.strip().count("\n") == 0 and "deadbeef" in res.stderr


def test_not_a_database_is_one_line(tmp_path):
    db = tmp_path / "t.db"
    db.write_bytes(b"this is not sqlite" * 100)
    res = run(["docs", "--db", str(db)])
    assert res.exit_code == EXIT_ERROR
    assert res.stderr.startswith("error: ") and res.stderr.strip().count("\n") == 0


# --- The prefix cache's disk tier (engine/prefix_cache.py) ----------------------------------


def _overwrite_tensor_bytes(path: Path) -> None:
    """Random bytes over every tensor of a safetensors file; its header and size stay intact."""
    import random

    raw = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(raw[:8], "little")
    raw[start:] = random.Random(3).randbytes(len(raw) - start)
    path.write_bytes(bytes(raw))


def test_prefix_cache_file_with_overwritten_tensor_bytes_is_recomputed(tmp_path, caplog):
    """Issue 17: such a file used to be served as the prefix. Now: one warning naming it, the
    segment prefilled again (logits equal dense attention's: nothing wrong served, nothing
    lost), the damaged file removed and written anew from the recomputed K/V."""
    import torch
    from docqa.engine.prefix_cache import PrefixCache, chain_hashes

    from test_prefix_cache import CFG, SEG, SETTINGS, TOL, ask, dense_logits, ids, rel_err, tiny_model

    model, doc = tiny_model(), ids(300, 11)
    kv = tmp_path / "kv"
    ask(model, PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=kv), "doc-1", doc + ids(10, 12))
    files = sorted(kv.glob("*/*.safetensors"), key=lambda p: p.stat().st_mtime)
    assert len(files) == 2  # two full segments of the 300-token document
    cache = PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=kv)
    first = cache._path(chain_hashes(cache.namespace("doc-1"), doc, SEG)[0])
    size = first.stat().st_size
    _overwrite_tensor_bytes(first)
    assert first.stat().st_size == size

    cache = PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=kv)  # a new process: disk tier only
    prompt = doc + ids(12, 13)
    with caplog.at_level("WARNING", logger="docqa.engine.prefix_cache"):
        state, cached = cache.get_state("doc-1", prompt)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and str(first) in warnings[0].getMessage()
    assert "checksum" in warnings[0].getMessage() and "\n" not in warnings[0].getMessage()
    assert cached == 0 and not first.exists()  # the damaged first segment stops the prefix
    logits = model(torch.tensor(prompt), state, last_only=True)
    assert rel_err(logits, dense_logits(model, prompt)) < TOL
    cache.save("doc-1", prompt, state)
    assert first.exists()  # written anew, and now it serves
    again = PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=kv)
    state, cached = again.get_state("doc-1", prompt)
    assert cached == 2 * SEG and again.hits_disk == 2
    logits = model(torch.tensor(prompt[cached:]), state, last_only=True)
    assert rel_err(logits, dense_logits(model, prompt)) < TOL


def test_prefix_cache_removes_stale_tmp_files_and_keeps_fresh_ones(tmp_path):
    """A writer killed between writing its `*.tmp` and renaming it leaves the tmp file; the
    next save removes it once stale (an hour old), but never one another process is writing."""
    import os
    import time

    from docqa.engine.prefix_cache import STALE_TMP_S, PrefixCache

    from test_prefix_cache import CFG, SETTINGS, ask, ids, tiny_model

    kv = tmp_path / "kv"
    (kv / "ab").mkdir(parents=True)
    stale, fresh = kv / "ab" / "ab12.0f0f.tmp", kv / "ab" / "ab34.1e1e.tmp"
    stale.write_bytes(b"half a segment")
    fresh.write_bytes(b"being written")
    old = time.time() - STALE_TMP_S - 60
    os.utime(stale, (old, old))
    ask(tiny_model(), PrefixCache.for_config(CFG, "model-a", SETTINGS, cache_dir=kv), "doc-1", ids(300, 14))
    assert not stale.exists() and fresh.exists()
    assert len(list(kv.glob("*/*.safetensors"))) == 2  # the save itself was not disturbed


def test_a_last_line_longer_than_a_segment_ingests(tmp_path):
    """A text whose last line alone is over the segment budget (one long paragraph without
    line breaks) was `unexpected IndexError` in the segment cutter."""
    path = tmp_path / "one_paragraph.txt"
    path.write_text("AGREEMENT\n\n" + "Clause 1 binds the parties. " * 3000, encoding="utf-8")
    res = run(["ingest", str(path), "--json", "--db", str(tmp_path / "d.db")])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)[0]["segments"] == 2
