#!/usr/bin/env bash
# The main job on a fresh machine: set up, ingest a sample contract, answer a question on it
# with the default model, citations verified against the page and lines they name.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export DOCQA_DB=${DOCQA_DB:-$PWD/.cache/demo.db}
mkdir -p .cache
.venv/bin/python fixtures/make_pdf.py   # fixtures/sample_contract.pdf from its text
.venv/bin/docqa ingest fixtures/sample_contract.pdf
.venv/bin/docqa ask fixtures/sample_contract.pdf "${1:-How much notice must the Customer give to terminate for convenience?}"
