#!/usr/bin/env bash
# Issue 30's Kineto check on the lent machine's CPU cores: one rank of kineto_gpt2.py's GPT-2
# profiled, the same model run with 2 and 4 DDP ranks over Gloo (each rank pinned to CPUs of
# its own), the Gloo all-reduce calibrated with ddlsim on 2 and 4 ranks, the profiler's cost
# per event measured; everything in one archive. Compare here afterwards with
# benchmarks/kineto_cpu_dp_compare.py (docs/traces.md, "Figures").
#
#   OUT=DIR bash benchmarks/device/kineto_cpu_dp.sh        # DIR/kineto_cpu_dp.tar.gz, DIR/log.txt
#   KINETO_DP_SMALL=1 OUT=DIR bash benchmarks/device/kineto_cpu_dp.sh   # dry run: 2 ranks x 1 CPU
#
# Settings (environment): KINETO_DP_THREADS (torch threads per rank, default 3),
# KINETO_DP_CPUS (CPUs per rank, default 4: the threads and one spare core for Gloo's and DDP's
# threads), KINETO_DP_BATCH (micro-batch per rank, default 8), KINETO_DP_RANKS (default "2 4"),
# KINETO_DP_BUDGET (seconds for the whole script, default 200). Needs torch (CPU is enough);
# ddlsim runs from this tree, its missing dependencies installed from .whl/ when absent.
set -u
repo=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:?set OUT to the folder the results go to}
res=$(mktemp -d)/kineto_cpu_dp
mkdir -p "$res" "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}   # one host: Gloo over loopback, no DNS
start=$(date +%s)
budget=${KINETO_DP_BUDGET:-200}
if [ -n "${KINETO_DP_SMALL:-}" ]; then
    threads=1 cpus=1 batch=4 ranks_list="2" steps=5 overhead_iters=1000 overhead_reps=2 reps=3
else
    threads=${KINETO_DP_THREADS:-3} cpus=${KINETO_DP_CPUS:-4} batch=${KINETO_DP_BATCH:-8}
    ranks_list=${KINETO_DP_RANKS:-"2 4"} steps=20 overhead_iters=10000 overhead_reps=3 reps=10
fi
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$out/log.txt"; }
pack() { tar -czf "$out/kineto_cpu_dp.tar.gz.part" -C "$(dirname "$res")" kineto_cpu_dp \
         && mv "$out/kineto_cpu_dp.tar.gz.part" "$out/kineto_cpu_dp.tar.gz"; }
step() {   # step NAME SECONDS COMMAND... : under its limit and what is left of the budget
    local name=$1 limit=$2 left rc; shift 2
    left=$((budget - ($(date +%s) - start)))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 10 ]; then log "skip $name: ${left} s of the budget left"; return 1; fi
    log "start $name (limit ${limit} s)"
    timeout --signal=INT --kill-after=5 "$limit" "$@" >"$res/$name.out" 2>&1
    rc=$?
    log "end $name rc=$rc"
    grep -v '^USDT' "$res/$name.out" | tail -n 4 | tee -a "$out/log.txt"
    pack
    return $rc
}

if ! python3 -c "import pydantic, simpy" 2>/dev/null; then   # the device's image lacks them
    log "installing ddlsim's missing dependencies from .whl/"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site "$repo"/.whl/pydantic-*.whl "$repo"/.whl/pydantic_core-*.whl \
        "$repo"/.whl/simpy-*.whl "$repo"/.whl/annotated_types-*.whl \
        "$repo"/.whl/typing_inspection-*.whl 2>&1 | tail -n 3
    export PYTHONPATH=/tmp/site:$repo${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$repo${PYTHONPATH:+:$PYTHONPATH}
fi
cd "$repo"
drive=(python3 benchmarks/device/kineto_cpu_dp_step.py --threads "$threads" --cpus-per-rank "$cpus"
       --batch "$batch" --steps "$steps")

step facts 20 bash -c 'lscpu; echo; nproc; echo "GLOO_SOCKET_IFNAME=$GLOO_SOCKET_IFNAME"; cat /sys/fs/cgroup/cpu.max 2>/dev/null; free -g; uptime
    python3 -c "import os, sys, torch; sys.path.insert(0, \"benchmarks/device\")
from kineto_cpu_dp_step import cpu_order
print(sys.version); print(\"torch\", torch.__version__)
print(\"affinity\", sorted(os.sched_getaffinity(0))); print(\"cpu order\", cpu_order())
print(torch.__config__.parallel_info())"
    python3 -c "import ddlsim, pydantic, simpy; print(\"ddlsim imports from\", ddlsim.__file__)"
    python3 -m ddlsim.calibration comm --help >/dev/null && echo "ddlsim calibrate comm: ok"'
step dp1 60 "${drive[@]}" --ranks 1 --profile --out "$res/dp1.json" || log "dp1 failed: no profile"
read -r ops lo hi < <(python3 benchmarks/kineto_cpu_dp_compare.py "$res" --calibration-sizes \
                     --work "$res/compare" 2>>"$res/sizes.err")
log "calibrate ${ops:-?} from ${lo:-?} to ${hi:-?} bytes"
calibrate() {   # calibrate N: ddlsim's Gloo benchmark on N ranks (torchrun's, unpinned, machine idle)
    step "gloo$1" 60 python3 -m torch.distributed.run --standalone --nproc-per-node "$1" \
        -m ddlsim.calibration comm --backend gloo --ops "$ops" --min-bytes "$lo" \
        --max-bytes "$hi" --warmup 2 --reps "$reps" --clock wall --no-split --no-progress \
        -o "$res/gloo$1.csv" --force
}
for n in $ranks_list; do
    step "dp$n" 60 "${drive[@]}" --ranks "$n" --port $((29530 + n)) --out "$res/dp$n.json"
    [ -n "${ops:-}" ] && calibrate "$n"
done
# the profiler's cost per event (about 1 % of the step on the development machine): last
step overhead 45 python3 benchmarks/kineto_overhead.py -o "$res/overhead.json" \
    --iterations "$overhead_iters" --repeats "$overhead_reps"
step dp1_again 40 "${drive[@]}" --ranks 1 --out "$res/dp1_again.json"   # drift over the session
log "done in $(($(date +%s) - start)) s: $out/kineto_cpu_dp.tar.gz"
