#!/bin/bash
# Device run helper (development calls; run from the repository root as bash bench/gpu_dev.sh): the GPU tests named by $TESTS (pytest -k), then
# bench/gpu.py with the arguments given. The final verification uses the commands in gpu.md.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
mkdir -p /tmp/p && ln -sfn "$PWD" /tmp/p/docqa
export PYTHONPATH=/tmp/p:/tmp/site PYTHONUNBUFFERED=1
if [ -n "$TESTS" ]; then
  python3 -m pytest -q -p no:cacheprovider tests/test_triton_kernels.py tests/test_gpu.py -k "$TESTS" 2>&1 | tee $OUT/tests.log
fi
python3 bench/gpu.py "$@" --json $OUT/gpu.json 2>&1 | tee $OUT/gpu.log
