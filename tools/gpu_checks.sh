#!/bin/bash
# The GPU checks of a machine lent for a few minutes, in one call: `bash tools/gpu_checks.sh [OUT]`
# from the repository root, on a machine with CUDA, torch and Triton (logs go to OUT, default $OUT).
# In order, each with a time limit, about 10 minutes in all (the last bench may be cut): the native
# libraries built once (before pytest's workers race for them), `pytest -m gpu`, then the benches
# whose CUDA figures bench/RESULTS.md holds (overhead S, S with an accelerator's statistics on the
# native path, monitor M, stats_pass, tensor_dump, overhead M, graph_dump at one size). Where a GPU
# test fails, its tmp_path (dumps and all) comes back as failed.tgz, so that a failure can be read
# without another lease. The figures go into bench/RESULTS.md by hand; the logs say which command
# made each.
set -u
OUT=${1:-${OUT:?give a folder for the logs}}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD PYTHONUNBUFFERED=1
LOG=$OUT/machine.log BENCH=$OUT/bench.log TMP=$(mktemp -d)/pytest  # the GPU tests' tmp_path folders
stamp() { echo "$(date -u +%H:%M:%S) $*" >> "$LOG"; }
run() {  # run LIMIT COMMAND...: the command and its rc into bench.log
    local limit=$1; shift
    echo "\$ $*" >> "$BENCH"
    timeout "$limit" "$@" >> "$BENCH" 2>&1
    echo "rc=$?" >> "$BENCH"
    stamp "$* done"
}
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, triton.__version__)"
    echo "cores $(nproc)"
    git log -1 --format=%h 2>/dev/null || true
} > "$LOG" 2>&1
stamp start
python3 - >> "$LOG" 2>&1 <<'EOF'
from torchdebug.native.build import load_library, load_torch_extension, load_torch_library
print([load_library("stats"), *map(load_torch_library, ("observer", "slot_walk", "c10d_work")), load_torch_extension("ring_sums")])
EOF
stamp "native libraries built"
timeout 220 python3 -m pytest -m gpu -n 8 -q -p no:cacheprovider --basetemp="$TMP" -rf tests > "$OUT/pytest.log" 2>&1
echo "rc=$?" >> "$OUT/pytest.log"
stamp "pytest -m gpu done"
python3 tools/failed_tmp_paths.py "$OUT/pytest.log" "$TMP" "$OUT/failed.tgz" >> "$LOG" 2>&1
run 90 python3 bench/overhead.py --device cuda --size S --steps 5 --warmup 1
run 60 python3 bench/overhead.py --device cuda --size S --steps 5 --warmup 1 --native-devices --modes plain statistics/op statistics+checksum/op checksum/op statistics/mix
run 60 python3 bench/monitor.py --device cuda --size M --steps 3 --warmup 1
run 40 python3 bench/stats_pass.py --device cuda
run 40 python3 bench/tensor_dump.py --device cuda
run 130 python3 bench/overhead.py --device cuda --size M --steps 3 --warmup 1
run 130 python3 bench/graph_dump.py --device cuda --sizes 768x1024 --steps 5
stamp end
