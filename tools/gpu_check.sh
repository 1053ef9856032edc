#!/usr/bin/env bash
# On a lent GPU machine (device tool): the CUDA tests, the GPU-sized peer benchmark, then every
# probe on ImageNet-sized timm ViTs. Each stage has its own time limit, so one that
# runs long leaves the others their share of a short lease; what each wrote stays under $OUT.
#   TESTS_TIMEOUT=90 BENCH_TIMEOUT=180 REALSIZE_TIMEOUT=270 bash tools/gpu_check.sh [all|tests|bench|realsize]
# The machine has torch, timm, typer, rich, safetensors, pyyaml and scipy but no network, so the
# peers travel as wheels in .whl/ (see benchmarks/README.md) and flatcheck runs from src/.
set -uo pipefail
OUT=${OUT:-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1
stage=${1:-all}; shift || true
{ nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
  python3 -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__, torch.cuda.get_device_name(0))"
  nproc; } 2>&1 | tee "$OUT/gpu.txt"
case "$stage" in
  tests|all) timeout "${TESTS_TIMEOUT:-300}" python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 \
      | tee "$OUT/tests.log" | tail -25 ;;
esac
case "$stage" in
  bench|all) timeout "${BENCH_TIMEOUT:-420}" python3 benchmarks/bench_peers.py --device cuda --full --save \
      --results-dir "$OUT" --row-timeout "${ROW_TIMEOUT:-150}" "$@" 2>&1 | tee "$OUT/bench.log" | tail -40 ;;
esac
case "$stage" in
  realsize|all) timeout "${REALSIZE_TIMEOUT:-600}" python3 benchmarks/bench_realsize.py --device cuda \
      --models "${REALSIZE_MODELS:-vit_base_patch16_224,vit_small_patch16_224,vit_tiny_patch16_224}" \
      --samples "${REALSIZE_SAMPLES:-8,16}" --timeout "${CHILD_TIMEOUT:-90}" \
      --out "$OUT/realsize_vit_gpu.md" --jsonl "$OUT/realsize_vit_gpu.jsonl" ${REALSIZE_ARGS:-} 2>&1 | tail -60 ;;
esac
