#!/usr/bin/env bash
# A lent GPU machine's checks, as one script with a deadline (docs/gpu.md, "A GPU session"):
#   1. `datapipe doctor --gpu --json`           -> $OUT/doctor-gpu.json
#   2. tests/backends/test_gpu.py               -> session.log (the end-to-end doctor test is step 1)
#   3. `datapipe bench` DALI pipeline + h2d suites  -> $OUT/bench-gpu.json, on tools/make_sample.py's photos
#   4. `datapipe train` ResNet-50 AMP, a few steps: DALI default and DeiT, prefetch DeiT -> $OUT/train-gpu.log
# Run from the repository root with datapipe's dependencies importable. Each step gets what is left of
# DEADLINE seconds (at most its own limit), so one hang cannot eat the others' time.
set -u
OUT=${OUT:-build/gpu}
DEADLINE=${DEADLINE:-540}
WORK=${WORK:-/tmp/dp-gpu}
PY=${PY:-python3}
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)

step() {  # step NAME LIMIT CMD...: runs CMD under the smaller of LIMIT and the time left
    local name=$1 limit=$2 left
    shift 2
    left=$(( DEADLINE - ($(date +%s) - start) - 5 ))
    (( left < limit )) && limit=$left
    if (( limit < 10 )); then echo "== $name: skipped, no time left"; return; fi
    echo "== $name (at most ${limit}s, t=$(( $(date +%s) - start ))s)"
    timeout -k 5 "$limit" "$@"
    echo "== $name: exit $? after $(( $(date +%s) - start ))s"
}

step machine 30 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc;
  $PY -c 'import torch, nvidia.dali as d; print(\"torch\", torch.__version__, \"dali\", d.__version__)'"
step doctor 150 bash -c "$PY -m datapipe doctor --gpu --json > $OUT/doctor-gpu.json; s=\$?;
  $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); [print(r[\"check\"], r[\"status\"], r.get(\"figure\") or \"\", r.get(\"detail\",\"\")[:160]) for r in d[\"results\"]]' $OUT/doctor-gpu.json; exit \$s"
step test_gpu 240 $PY -m pytest -q -p no:cacheprovider -rA tests/backends/test_gpu.py \
    --deselect tests/backends/test_gpu.py::test_doctor_gpu_end_to_end_json --basetemp "$WORK/pytest"
step sample 90 bash -c "$PY tools/make_sample.py --out $WORK/sample --per-class 400 --overwrite --no-extras > /dev/null &&
  $PY -m datapipe convert $WORK/sample $WORK/sample.lmdb --overwrite -q"
step bench 120 $PY -m datapipe bench "$WORK/sample.lmdb" --suites pipeline,h2d --backends dali \
    --batch-size 128 --image-size 224 --seconds 4 --repeats 3 --json "$OUT/bench-gpu.json"
for run in "dali default" "dali deit" "prefetch deit"; do
    set -- $run
    step "train_$1_$2" 75 bash -c "$PY -m datapipe train $WORK/sample.lmdb --model resnet50 --epochs 1 --batch-size 128 \
      --image-size 224 --backend $1 --recipe $2 --max-steps 8 --log-every 2 --out $WORK/train-$1-$2 2>&1 |
      tee -a $OUT/train-gpu.log"   # --max-steps ends mid-epoch: metrics.jsonl holds finished epochs only
done
echo "== done in $(( $(date +%s) - start ))s"
