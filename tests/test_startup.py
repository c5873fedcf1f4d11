"""Commands that do not run the engine must not import it: torch and triton cost seconds of
CPU before anything happens (issue 17; figures in bench/results/startup.md). An evidence-only
question is embedded by the numpy MiniLM (`engine.models.bert_numpy`), which needs only
`tokenizers` (a few hundredths of a second to import); `docqa ingest` loads torch to give
passages their vectors.

Each check runs in a fresh interpreter, since this test process may have imported torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sample_contract.pdf"
HEAVY = ("torch", "triton", "transformers")
# What `--help` alone must not load either (issue 31 item 9: it cost 0.5 s of CPU, sqlite_utils
# alone 0.14 s): the store and numpy. (pydantic is not in the list: typer itself loads it to
# run any subcommand, `--help` included.)
HELP_HEAVY = ("sqlite_utils", "numpy")

PROBE = """
import json, sys
from typer.testing import CliRunner
from docqa.app.cli import app
codes = [CliRunner().invoke(app, args, catch_exceptions=False).exit_code for args in json.loads(sys.argv[1])]
print(json.dumps({"codes": codes, "loaded": [m for m in %r if m in sys.modules]}))
""" % (HEAVY + HELP_HEAVY,)


def probe(commands: list[list[str]], env: dict) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(commands)], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def env(tmp_path):
    import os

    return {**os.environ, "DOCQA_DB": str(tmp_path / "d.db"), "XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_help_docs_show_and_evidence_only_ask_do_not_import_the_engine(env):
    assert probe([["ingest", str(FIXTURE)]], env)["codes"] == [0]
    commands = [["--help"], ["docs"], ["show", str(FIXTURE)],
                ["show", str(FIXTURE), "--page", "3"], ["runs"],
                ["ask", str(FIXTURE), "Which law governs?", "--evidence-only"],
                ["ingest", "--help"], ["ask", "--help"], ["engine", "--help"]]
    got = probe(commands, env)
    assert got["codes"] == [0] * len(commands)
    assert [m for m in got["loaded"] if m in HEAVY] == []


def test_help_loads_neither_the_store_nor_the_document_models(env):
    commands = [["--help"], ["ingest", "--help"], ["ask", "--help"], ["summarize", "--help"], ["engine", "--help"]]
    got = probe(commands, env)
    assert got["codes"] == [0] * len(commands)
    assert got["loaded"] == []


def test_the_probe_can_see_an_engine_import(env):
    """The check above can fail: `engine generate --help` is still light, but loading the
    engine module (as `ask` with a model does) shows up."""
    code = PROBE.replace("print(json.dumps", "import docqa.engine.generate\nprint(json.dumps")
    done = subprocess.run([sys.executable, "-c", code, json.dumps([["--help"]])], capture_output=True,
                          text=True, env=env, timeout=300)
    assert "torch" in json.loads(done.stdout.strip().splitlines()[-1])["loaded"]
