#!/usr/bin/env bash
# The quickstart's seeds on both kernel paths of one CPU, in parallel (one process per run, each
# single-threaded as the quickstart pins it), then one table row per run (bench/quickstart_rows.py):
# the "Quickstart: the four checks per seed and kernel path" table of docs/benchmarks.md.
#   bash bench/quickstart_seeds.sh OUT [SEEDS] [PATHS] [-- quickstart arguments]
#     OUT     folder for the runs: OUT/seed-K-native, OUT/seed-K-avx2 (+ .log each)
#     SEEDS   default "0 1 2 3 4"
#     PATHS   default "native avx2": native = the CPU's own kernels (AVX-512 where it has them);
#             avx2 = ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
#             (the AVX2 kernels on the same CPU: other float rounding, not another CPU family)
# Needs a core per run (10 runs: a 16-core machine); on 2 cores run `make quickstart SEED=K` instead.
# PYTHON (default .venv/bin/python) runs the quickstart.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bash bench/quickstart_seeds.sh OUT [SEEDS] [PATHS] [-- quickstart arguments]}
seeds=${2:-0 1 2 3 4}
paths=${3:-native avx2}
shift $(( $# < 3 ? $# : 3 ))
[ "${1:-}" = "--" ] && shift
python=${PYTHON:-.venv/bin/python}
mkdir -p "$out"
runs=()
for seed in $seeds; do
  for path in $paths; do
    case $path in
      native) env=() ;;
      avx2) env=(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2) ;;
      *) echo "error: kernel path '$path': expected native or avx2" >&2; exit 2 ;;
    esac
    run=$out/seed-$seed-$path
    env "${env[@]}" OMP_NUM_THREADS=1 "$python" -m training.quickstart --out "$run" --seed "$seed" "$@" \
      >"$run.log" 2>&1 &
    runs+=("$run")
  done
done
echo "started ${#runs[@]} runs under $out (logs: $out/seed-*.log)"
status=0
wait || status=$?
"$python" bench/quickstart_rows.py "${runs[@]}" || status=$?
exit $status
