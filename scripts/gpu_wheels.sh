#!/usr/bin/env bash
# Wheels of docqa's dependencies that the lent GPU machine's image lacks (it has torch, triton,
# transformers, tokenizers, safetensors, typer, rich, lxml, jinja2, pyyaml and numpy, but no
# package index): downloaded here for its Python 3.12 on x86-64 into .whl/, which bench/gpu_run.sh
# installs there. .whl/ is git-ignored and travels with `carry`.
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl && mkdir -p .whl
get() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "$@"
}
# versions as pinned in pyproject.toml (and what they need)
get pydantic==2.14.4 pydantic-core annotated-types typing-inspection sqlite-utils==4.2.1 sqlite-fts4 \
    click-default-group pypdf==7.1.1 gguf==0.19.0 textual==8.2.8 mdit-py-plugins platformdirs
ls -la .whl | tail -n +2
du -sh .whl
