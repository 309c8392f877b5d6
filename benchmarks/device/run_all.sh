#!/usr/bin/env bash
# The device suite in one call, for a lent GPU whose time is short: each microbenchmark under its
# own time limit, in order of what is worth most, the results packed into one archive after each
# step so that a step cut short keeps what came before.
#
#   OUT=DIR bash benchmarks/device/run_all.sh      # writes DIR/device_results.tar.gz, DIR/log.txt
#                                                  # and the Kineto trace of llama_step.py
#
# Needs PyTorch with CUDA (the lent machine's image has it); ddlsim is not needed there.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:?set OUT to the folder the results go to}
res=$(mktemp -d)/device_results
mkdir -p "$res"
export PYTHONUNBUFFERED=1
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$out/log.txt"; }
pack() { tar -czf "$out/device_results.tar.gz.part" --exclude='*.json.gz' -C "$(dirname "$res")" device_results \
         && mv "$out/device_results.tar.gz.part" "$out/device_results.tar.gz"; }
step() {   # step NAME SECONDS COMMAND...
    local name=$1 limit=$2; shift 2
    log "start $name (limit ${limit} s)"
    timeout --signal=INT --kill-after=10 "$limit" "$@" >"$res/$name.out" 2>&1
    log "end $name rc=$?"
    tail -n 5 "$res/$name.out" | tee -a "$out/log.txt"
    pack
}
step nvidia_smi 20 nvidia-smi -q -d CLOCK,POWER,PERFORMANCE,TEMPERATURE
step versions 30 python3 -c "import torch,sys;print(sys.version);print(torch.__version__,torch.version.cuda,torch.backends.cudnn.version(),torch.cuda.get_device_name(0))"
step launch 30 python3 "$here/launch_time.py" --out "$res/launch.json"
step sync_wake 25 python3 "$here/sync_wake.py" --out "$res/sync.json"
step llama_step 130 python3 "$here/llama_step.py" --out "$res/llama" --budget-s 60
cp "$res"/llama/*.json.gz "$out"/ 2>/dev/null   # the Kineto trace travels on its own (size)
step resnet_step 60 python3 "$here/resnet_step.py" --out "$res/resnet"
step kernels 190 python3 "$here/h100_kernels.py" --shapes "$here/kernel_shapes.json" --out "$res/kernels" \
    --only sustained,gemm,attention,memory,launch
step wgrad 40 python3 "$here/wgrad_accumulate.py" --out "$res/wgrad"
step ring_kernels 35 python3 "$here/ring_attention.py" kernels --out "$res/ring"
step nvidia_smi_after 20 nvidia-smi -q -d CLOCK,POWER,PERFORMANCE,TEMPERATURE
log "done"
