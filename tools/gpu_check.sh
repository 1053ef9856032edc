#!/usr/bin/env bash
# On a lent GPU machine (device tool): the CUDA tests, then the GPU-sized peer benchmark.
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
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import torch, timm; print('torch', torch.__version__, 'timm', timm.__version__, torch.cuda.get_device_name(0))"
case "${1:-all}" in
  tests|all) python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py 2>&1 | tee "$OUT/tests.log" | tail -25 ;;
esac
case "${1:-all}" in
  bench|all) shift || true
    timeout "${BENCH_TIMEOUT:-420}" python3 benchmarks/bench_peers.py --device cuda --full --save \
      --results-dir "$OUT" --row-timeout 150 "$@" 2>&1 | tee "$OUT/bench.log" | tail -60 ;;
esac
