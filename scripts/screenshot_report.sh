#!/usr/bin/env bash
# Renders an exported HTML report in headless Chromium (Debian: apt-get install chromium),
# as docs/report.png was made:
#   .venv/bin/python bench/review_eval.py            # review job "cuad-eval" over the CUAD contracts
#   .venv/bin/docqa export cuad-eval --format html -o /tmp/report.html --db /tmp/docqa-review-eval.db
#   scripts/screenshot_report.sh /tmp/report.html docs/report.png
set -euo pipefail
report=${1:?usage: scripts/screenshot_report.sh REPORT.html [OUT.png]}
out=${2:-docs/report.png}
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$profile" --window-size=1280,1400 --hide-scrollbars \
  --screenshot="$(realpath -m "$out")" "file://$(realpath "$report")"
