#!/usr/bin/env bash
# Issue 16's GPU measurements on one H200, in three device calls of < 10 minutes each:
#   bash bench/gpu_issue16.sh e2e        # a whole GRPO step, ours vs TRL (item 1)
#   bash bench/gpu_issue16.sh regress    # policy-update MFU and decode share of the bound (item 4)
#   bash bench/gpu_issue16.sh rollouts   # 128 rollouts x 8 turns through collect_rollouts + the static decoder
# Needs wheels in .whl/ (TRL 1.16.0, datasets 5.2.0, dill, multiprocess, transformers 5.19.0,
# pydantic + its deps, and the gateway's httpx2/httpcore2/truststore/h11/h2/hpack/hyperframe/tenacity,
# which the device image lacks: docs/benchmarks.md lists them); logs and JSON go to $OUT.
set -u
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
OUT=${OUT:-.}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
case "${1:-}" in
  e2e)
    timeout 540 python3 bench/gpu_grpo_e2e.py --json "$OUT/e2e.json" > "$OUT/e2e.log" 2>&1
    echo "gpu_grpo_e2e rc=$?"; grep -E "^ours|^trl|^\||ours /|Error" "$OUT/e2e.log" | cut -c1-1200 ;;
  regress)
    timeout 200 python3 bench/gpu_train_step.py --variants trainer-amp --warmup 3 > "$OUT/train_step.log" 2>&1
    echo "gpu_train_step rc=$?"; tail -8 "$OUT/train_step.log"
    timeout 300 python3 bench/gpu_decode.py --batches 64 --variants static static-amp --no-parts > "$OUT/decode.log" 2>&1
    echo "gpu_decode rc=$?"; tail -8 "$OUT/decode.log" ;;
  rollouts)
    timeout 540 python3 bench/gpu_rollouts.py --json "$OUT/rollouts.json" > "$OUT/rollouts.log" 2>&1
    echo "gpu_rollouts rc=$?"; tail -12 "$OUT/rollouts.log" | cut -c1-1200 ;;
  *) echo "usage: bash bench/gpu_issue16.sh e2e|regress|rollouts" >&2; exit 2 ;;
esac
