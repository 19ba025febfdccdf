#!/usr/bin/env bash
# The GPU benches, each one device call of < 10 minutes on one H200 (logs and JSON to $OUT):
#   bash bench/gpu_suite.sh e2e        # a whole GRPO step on varied lengths, ours (cold; fresh caches + the cold run's
#                                      # run.compile_artifacts file; warm) vs TRL GRPOTrainer.train()
#   bash bench/gpu_suite.sh e2e-fixed  # the same on the old fixed shape (every row to the cap)
#   bash bench/gpu_suite.sh compile-cold  # cold compile seconds and graphs per phase: previous (whole) vs regional
#   bash bench/gpu_suite.sh regress    # policy-update MFU and decode share of the bound at 0.6B
#   bash bench/gpu_suite.sh rollouts   # 128 rollouts x 8 turns through collect_rollouts + the static decoder
#   bash bench/gpu_suite.sh qwen3-8b-decode qwen3-8b-update   # Qwen3-8B shape: decode at 8-128 rows x 2k-16k-token
#                                      # prompts against the weights + KV bound; the update's MFU
#   bash bench/gpu_suite.sh async-s0   # asynchronous training at max_staleness 0 (then async-s1, async-s2: one per call)
#   bash bench/gpu_suite.sh async-c1   # the same in completion order (algorithm.async_order; async-c2, async-c3, async-c4)
#   bash bench/gpu_suite.sh retrieval  # Wikipedia-scale (21M x 768) GPU retrieval: index, encoder, server front ends
# Several names run in one call, in order.
# Needs the wheels the device image lacks in .whl/ (TRL, transformers 5.19, pydantic, the gateway's
# HTTP stack, the retrieval server's FastAPI/uvicorn/faiss-cpu): `bash bench/device_wheels.sh` fetches
# them; a device call carries them with carry [".whl"].
set -u
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TRANSFORMERS_VERBOSITY=error
OUT=${OUT:-.}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site || exit 1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
E2E_OURS="--steps 8"
E2E_TRL="--trl-steps 3"
[ $# -gt 0 ] || set -- usage
for call in "$@"; do
case "$call" in
  e2e)   # variable-length steps (forced EOS, varied prompts): ours cold (fresh compile caches), then warm + TRL
    export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-e2e TRITON_CACHE_DIR=/tmp/triton-e2e
    rm -rf "$TORCHINDUCTOR_CACHE_DIR" "$TRITON_CACHE_DIR"
    rm -f /tmp/e2e-artifacts.bin   # the cold run writes what its step 1 compiled (run.compile_artifacts)
    timeout 150 python3 bench/gpu_grpo_e2e.py --sides ours $E2E_OURS --compile-artifacts /tmp/e2e-artifacts.bin \
      --json "$OUT/e2e_cold.json" > "$OUT/e2e_cold.log" 2>&1
    echo "gpu_grpo_e2e cold rc=$?"; grep -E "^ours |^\||^compile art|Error" "$OUT/e2e_cold.log" | cut -c1-900
    # a fresh process, other empty cache folders, only the artifacts file carried over (a new node or container)
    export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-e2e-art TRITON_CACHE_DIR=/tmp/triton-e2e-art
    rm -rf "$TORCHINDUCTOR_CACHE_DIR" "$TRITON_CACHE_DIR"
    timeout 130 python3 bench/gpu_grpo_e2e.py --sides ours $E2E_OURS --compile-artifacts /tmp/e2e-artifacts.bin \
      --json "$OUT/e2e_artifacts.json" > "$OUT/e2e_artifacts.log" 2>&1
    echo "gpu_grpo_e2e artifacts rc=$?"; grep -E "^ours |^\||^run.compile_art|Error" "$OUT/e2e_artifacts.log" | cut -c1-900
    export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-e2e TRITON_CACHE_DIR=/tmp/triton-e2e
    timeout 250 python3 bench/gpu_grpo_e2e.py --sides ours trl trl-static $E2E_OURS $E2E_TRL \
      --json "$OUT/e2e_warm.json" > "$OUT/e2e_warm.log" 2>&1
    echo "gpu_grpo_e2e warm rc=$?"; grep -E "^ours |^trl|^\||ours /|Error" "$OUT/e2e_warm.log" | cut -c1-900
    unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR ;;
  e2e-fixed)   # the old fixed shape: 128-token prompts, every row to 256 tokens
    timeout 540 python3 bench/gpu_grpo_e2e.py --lengths cap --prompt-tokens 128 --tokens 256 --steps 6 \
      --json "$OUT/e2e.json" > "$OUT/e2e.log" 2>&1
    echo "gpu_grpo_e2e rc=$?"; grep -E "^ours|^trl|^\||ours /|Error" "$OUT/e2e.log" | cut -c1-1200 ;;
  compile-cold)   # each mode in a fresh process with empty Inductor / Triton caches (bench/compile_cold.py)
    timeout ${COMPILE_S:-480} python3 bench/compile_cold.py --device cuda --json "$OUT/compile_cold.json" \
      > "$OUT/compile_cold.log" 2>&1
    echo "compile_cold rc=$?"; grep -E "^== |^\||^\{|Error" "$OUT/compile_cold.log" | cut -c1-900 ;;
  regress)
    timeout 200 python3 bench/gpu_train_step.py --variants trainer-amp --warmup 3 > "$OUT/train_step.log" 2>&1
    echo "gpu_train_step rc=$?"; tail -8 "$OUT/train_step.log"
    timeout 300 python3 bench/gpu_decode.py --batches 64 --variants static static-amp --no-parts > "$OUT/decode.log" 2>&1
    echo "gpu_decode rc=$?"; tail -8 "$OUT/decode.log" ;;
  rollouts)
    timeout ${ROLLOUTS_S:-540} python3 bench/gpu_rollouts.py --repeats ${REPEATS:-2} --json "$OUT/rollouts.json" \
      > "$OUT/rollouts.log" 2>&1
    echo "gpu_rollouts rc=$?"; tail -12 "$OUT/rollouts.log" | cut -c1-1200 ;;
  qwen3-8b-decode)
    timeout ${DECODE_S:-330} python3 bench/gpu_decode.py --model 8b --tokens 64 --variants static:memory_fraction=0.9 \
      --grid ${GRID:-64:2048 8:16384 64:8192 128:4096 128:2048 8:2048} --out "$OUT/decode8b" > "$OUT/decode8b.log" 2>&1
    echo "gpu_decode 8b rc=$?"; grep -E "^\||Error" "$OUT/decode8b.log" | cut -c1-700 ;;
  qwen3-8b-update)
    timeout 200 python3 bench/gpu_train_step.py --model 8b --variants trainer-bf16 trainer-bf16-ckpt --rows 8 \
      --seq 4096 --prompt 2048 --micro 1 --warmup 2 --repeats 3 --out "$OUT/update8b" > "$OUT/update8b.log" 2>&1
    echo "gpu_train_step 8b rc=$?"; tail -6 "$OUT/update8b.log" | cut -c1-700 ;;
  async-s0|async-s1|async-s2|async-c1|async-c2|async-c3|async-c4)   # asynchronous training, one staleness per call
    # (heavy-tailed tools; issue 32); s: batch order, c: completion order (algorithm.async_order)
    name=${call#async-}; s=${name:1}; order=batch; [ "${name:0:1}" = c ] && order=completion
    # the compile cache lives in the (ignored) checkout, so a next call on the same warm machine reuses it
    export TORCHINDUCTOR_CACHE_DIR=$PWD/.cache/inductor TRITON_CACHE_DIR=$PWD/.cache/triton
    steps=$((2 * s + 6))   # 5 steady periods: after the start's burst (steps 2..s+1), before the end's drain (last s)
    timeout ${ASYNC_S:-540} python3 bench/async_rollouts.py --staleness "$s" --order $order --steps ${ASYNC_STEPS:-$steps} \
      --workdir /tmp/async --json "$OUT/async-$name.json" > "$OUT/async-$name.log" 2>&1
    echo "async_rollouts $name rc=$?"; cp /tmp/async/run-$name/metrics.jsonl "$OUT/async-$name-metrics.jsonl" 2>/dev/null
    # a time limit ends the bench before its summary: summarise the steps its run folders logged
    [ -s "$OUT/async-$name.json" ] || python3 bench/async_rollouts.py --summarize --workdir /tmp/async \
      --json "$OUT/async-$name.json" 2>&1 | grep -E "^staleness|^  steady" | cut -c1-300
    grep -E "^ +[0-9]+/[0-9]+ |^staleness|^  steady|Error" "$OUT/async-$name.log" | cut -c1-300
    unset TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR ;;
  retrieval)   # 21M x 768 on one GPU: index, top-k, encoder (eager vs CUDA graphs), the server at 8 / 1 / 4 front ends
    timeout ${RETRIEVAL_S:-560} python3 bench/retrieval_gpu.py --n 21000000 --sections build,index,recall,topk,encoder,server \
      --frontends 8,1,4 --tokenizer .whl/minilm-tokenizer --json "$OUT/gpu-retrieval.json" > "$OUT/retrieval.log" 2>&1
    echo "retrieval_gpu rc=$?"; tail -30 "$OUT/retrieval.log" | cut -c1-300 ;;
  *) echo "usage: bash bench/gpu_suite.sh CALL... (e2e e2e-fixed compile-cold regress rollouts qwen3-8b-decode qwen3-8b-update async-s0 async-s1 async-s2 async-c1 async-c2 async-c3 async-c4 retrieval)" >&2
     exit 2 ;;
esac
done
