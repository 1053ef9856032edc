#!/usr/bin/env bash
# On a lent GPU machine (device tool): every GPU measurement flatcheck needs, in one run of at
# most 9 minutes (a lease is 15 minutes, one call at most 10, and a start takes one or two). Each
# stage has its own time limit (seconds, overridable), so one that runs long leaves the others their
# share; the limits of `all` add up to 545 s. Rows are written as they finish, so a stage cut by
# its limit keeps what it measured.
#
#   stage       limit  what it measures
#   setup         20   nvidia-smi, torch/timm versions, the peers' wheels from .whl/ if present
#   tests         60   tests/backends/test_cuda.py -m realsize: every backend on the GPU against dense
#                      float64 truth computed on the CPU
#   throughput   150   benchmarks/bench_gpu_throughput.py: products/s, samples/s and FLOP/s as a
#                      fraction of the non-TF32 float32 peak, for trace (HVP and vᵀHv), lmax,
#                      adaptive sharpness (2nd order) and mls (estimate) on ViT-B/16 and ResNet-50;
#                      the batch is flatcheck's own (grown past 128 when the memory plan fits)
#   tf32          60   benchmarks/bench_tf32.py: each probe's value in float64, float32 and TF32
#                      on the demo DigitsCNN and test_vit, with the seconds TF32 saves
#   preset       115   benchmarks/bench_realsize.py --preset mls-vs-sharpness on ViT-B/16 at two
#                      reduced sample counts, projected to 1,000 samples (a line through both;
#                      counts below a full batch understate the per-sample slope)
#   peers        140   benchmarks/bench_peers.py --device cuda --full on ResNet-18: λmax and SLQ
#                      (65 s), then the traces (75 s); only when the peers' wheels are in .whl/
#                      (else a line saying so)
#   compile        -   (not in `all`) bench_gpu_throughput.py --compile-costs: one HVP's seconds by
#                      autograd, func eager and func compiled on ViT-B/16 and ResNet-50, the compile
#                      time, and whether --compile pays at 100 products; COMPILE_TIMEOUT (300)
#   realsize       -   (not in `all`) every probe on timm ViTs, REALSIZE_TIMEOUT (600)
#   next           -   the rows not measured yet (gpu_checks.md), in about 9 minutes: tests (60),
#                      ResNet-50's loops (120), the peers' SLQ (60) and traces (110) on ResNet-18,
#                      and every probe on ViT-B/16 at 16 and 32 samples at flatcheck's batch (150)
#
#   bash tools/gpu_check.sh [all|next|tests|throughput|tf32|preset|peers|compile|realsize]
#   (or a comma-separated list of stages: tests,peers)
#   THROUGHPUT_TIMEOUT=300 THROUGHPUT_ARGS="--samples 512" bash tools/gpu_check.sh throughput
#
# Results go to $RESULTS: $OUT/results when the device tool sets $OUT (copy them into
# benchmarks/results afterwards), else benchmarks/results; file names carry the GPU's name.
# The machine has torch, timm, typer, rich, safetensors, pyyaml and scipy but no network, so the
# peers travel as wheels in .whl/ (see benchmarks/README.md) and flatcheck runs from src/.
set -uo pipefail
# The device tool returns at most 8 files from $OUT, so there everything is written to a staging
# folder and packed into $OUT/gpu_check.tgz after every stage (a stage cut by the call's own limit
# still leaves the stages before it packed).
PACK=${OUT:-}
if [ -n "$PACK" ]; then STAGE=/tmp/gpu_check; RESULTS=${RESULTS:-$STAGE/results}; OUT=$STAGE; fi
RESULTS=${RESULTS:-benchmarks/results}; mkdir -p "$RESULTS"
OUT=${OUT:-out}; mkdir -p "$OUT"
pack() { [ -n "$PACK" ] && tar czf "$PACK/.gpu_check.tgz" -C "$OUT" . && mv "$PACK/.gpu_check.tgz" "$PACK/gpu_check.tgz"; true; }
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
stage=${1:-all}; shift || true
case $stage in
  all) stages=tests,throughput,tf32,preset,peers ;;
  next) stages=tests,throughput,peers,realsize
        : "${THROUGHPUT_TIMEOUT:=120}" "${THROUGHPUT_ARGS:=--models resnet50}"
        : "${PEERS_PARTS:=slq:60 trace:110}"
        : "${REALSIZE_TIMEOUT:=150}" "${REALSIZE_MODELS:=vit_base_patch16_224}" "${REALSIZE_SAMPLES:=16,32}"
        : "${REALSIZE_ARGS:=--batch-size auto --project 1000}" "${CHILD_TIMEOUT:=70}" ;;
  *) stages=$stage ;;
esac
want() { [[ ",$stages," == *",$1,"* ]]; }

timeout "${SETUP_TIMEOUT:-20}" bash -c '
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  fi
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
  python3 -c "import torch, timm; print(\"torch\", torch.__version__, \"timm\", timm.__version__, torch.cuda.get_device_name(0))"
  nproc' 2>&1 | tee "$OUT/gpu.txt"
pack
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$PYTHONPATH
gpu=$(python3 -c "import torch; print(torch.cuda.get_device_name(0))" 2>/dev/null | tr 'A-Z' 'a-z' \
      | sed -e 's/^nvidia //' -e 's/[^a-z0-9]\+/_/g' -e 's/_$//')
gpu=${gpu:-gpu}

if want tests; then
  timeout "${TESTS_TIMEOUT:-60}" python3 -m pytest -q -p no:cacheprovider -m realsize tests/backends/test_cuda.py 2>&1 \
    | tee "$OUT/tests.log" | tail -25
  pack
fi
if want throughput; then
  timeout "${THROUGHPUT_TIMEOUT:-150}" python3 benchmarks/bench_gpu_throughput.py --device cuda --samples 256 \
    --products 8 --lanczos 8 --count-samples 4 --out "$RESULTS/gpu_throughput_$gpu.md" \
    --jsonl "$RESULTS/gpu_throughput_$gpu.jsonl" ${THROUGHPUT_ARGS:-} 2>&1 | tee "$OUT/throughput.log" | tail -20
  pack
fi
if want tf32; then
  timeout "${TF32_TIMEOUT:-60}" python3 benchmarks/bench_tf32.py --device cuda --samples 256 \
    --probes "${TF32_PROBES:-trace,lmax,adaptive-sharpness,mls}" --out "$RESULTS/tf32_effect_$gpu.md" \
    --jsonl "$RESULTS/tf32_effect_$gpu.jsonl" ${TF32_ARGS:-} 2>&1 | tee "$OUT/tf32.log" | tail -15
  pack
fi
if want preset; then
  timeout "${PRESET_TIMEOUT:-115}" python3 benchmarks/bench_realsize.py --device cuda --preset mls-vs-sharpness \
    --models vit_base_patch16_224 --samples "${PRESET_SAMPLES:-16,32}" --batch-size auto --project 1000 \
    --timeout "${PRESET_CHILD_TIMEOUT:-55}" --out "$RESULTS/preset_vitb_$gpu.md" \
    --jsonl "$RESULTS/preset_vitb_$gpu.jsonl" ${PRESET_ARGS:-} 2>&1 | tee "$OUT/preset.log" | tail -15
  pack
fi
if want peers; then
  if [ -d /tmp/site ]; then
    # λmax and SLQ first (item 6's certified-accuracy rows), then the traces at equal products;
    # each call saves after every task, into its own folder
    for part in ${PEERS_PARTS:-eig,slq:65 trace:75}; do
      tasks=${part%%:*}; limit=${part##*:}; mkdir -p "$RESULTS/peers_${tasks//,/_}"
      timeout "$limit" python3 benchmarks/bench_peers.py --device cuda --full --models resnet18 --tasks "$tasks" \
        --backends autograd --save --results-dir "$RESULTS/peers_${tasks//,/_}" --row-timeout "${ROW_TIMEOUT:-40}" \
        ${PEERS_ARGS:-} 2>&1 | tee -a "$OUT/peers.log" | tail -12
      pack
    done
  else
    echo "peers: no wheels in .whl/, so no peer rows (see benchmarks/README.md)" | tee "$OUT/peers.log"
  fi
fi
if want compile; then
  timeout "${COMPILE_TIMEOUT:-300}" python3 benchmarks/bench_gpu_throughput.py --device cuda --compile-costs \
    --samples "${COMPILE_SAMPLES:-128}" --out "$RESULTS/compile_costs_$gpu.md" --jsonl "$RESULTS/compile_costs_$gpu.jsonl" \
    ${COMPILE_ARGS:-} 2>&1 | tee "$OUT/compile.log" | tail -15
  pack
fi
if want realsize; then
  timeout "${REALSIZE_TIMEOUT:-600}" python3 benchmarks/bench_realsize.py --device cuda \
    --models "${REALSIZE_MODELS:-vit_base_patch16_224,vit_small_patch16_224,vit_tiny_patch16_224}" \
    --samples "${REALSIZE_SAMPLES:-8,16}" --timeout "${CHILD_TIMEOUT:-90}" \
    --out "$RESULTS/realsize_vit_$gpu.md" --jsonl "$RESULTS/realsize_vit_$gpu.jsonl" ${REALSIZE_ARGS:-} 2>&1 | tail -60
  pack
fi
