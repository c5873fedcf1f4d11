"""A summary run killed with SIGKILL in the middle of its map step, in a real subprocess,
resumes: the rerun reads only the segments not stored, and ends with the summary an
uninterrupted run gives."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from docqa.app.store import Store
from docqa.app.summarize import summarize
from docqa.fixtures.make_pdf import write_sample_contract_pdf
from docqa.pipelines.ingest.build import ingest_file
from docqa.pipelines.ingest.record import make_record

from test_summarize import SECTION, Scripted

TESTS = str(Path(__file__).resolve().parent)

CHILD = """
import sys, time
sys.path.insert(0, {tests!r})
from test_summarize import SECTION, Scripted
from docqa.app.store import Store
from docqa.app.summarize import summarize

class Slow(Scripted):
    def __call__(self, messages, plan=None):
        time.sleep(1.0)  # a segment takes a while, so the kill lands mid-run
        return super().__call__(messages, plan)

summarize(Store({db!r}), [{doc!r}], SECTION, generate=Slow(), model_name="scripted")
print("finished", flush=True)
"""


class MapCounting(Scripted):
    def __init__(self):
        super().__init__()
        self.segments = 0

    def __call__(self, messages, plan=None):
        if "one topic" not in messages[0]["content"]:
            self.segments += 1
        return super().__call__(messages, plan)


def _stored(db: Path) -> int:
    with Store(db) as s:
        return s.db.execute("SELECT count(*) FROM summary_segments").fetchone()[0]


def test_kill_9_mid_map_then_rerun_continues(tmp_path):
    doc = ingest_file(write_sample_contract_pdf(tmp_path / "c.pdf"), segment_tokens=150)
    total = len(doc.segments)
    assert total >= 4
    db = tmp_path / "db.sqlite"
    with Store(db) as s:
        s.add_record(make_record(doc))
    child = subprocess.Popen([sys.executable, "-c", CHILD.format(tests=TESTS, db=str(db), doc=doc.doc_id)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=os.environ | {"DOCQA_DEBUG": "1"})
    try:
        deadline = time.monotonic() + 300
        while _stored(db) < 2:
            assert child.poll() is None, child.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the child stored nothing in time"
            time.sleep(0.1)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    stored = _stored(db)
    assert 2 <= stored < total, "the kill must land mid-run"

    with Store(db) as s:
        assert s.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        again = MapCounting()
        run, summ = summarize(s, [doc.doc_id], SECTION, generate=again, model_name="scripted")
        assert again.segments == total - stored
        assert summ.stats["resumed_segments"] == stored
        assert s.db.execute("SELECT count(*) FROM summary_segments").fetchone()[0] == total
    ref_db = tmp_path / "ref.sqlite"
    with Store(ref_db) as r:
        r.add_record(make_record(doc))
        _, ref = summarize(r, [doc.doc_id], SECTION, generate=Scripted(), model_name="scripted")
    assert summ.text() == ref.text() and summ.rejected == ref.rejected == total
