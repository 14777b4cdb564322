# shellcheck shell=bash
# Checks of scripts/gpu-check.sh (sourced by it): the stacks with the most reported
# failures for a library like gpucap, and the cost of a step. The driver-API versions run
# anywhere (the fake GPU in CI); PyTorch's and NCCL's where they work.
#   graphs        scripts/gpu/graphs.py graphs: a captured graph with memory nodes, charged
#                 as the driver reserves it at instantiate, upload and launch; when it does
#   graphs-torch  graphs.py torch-graph: torch.cuda.graph capture and replay (PyTorch)
#   nccl          scripts/gpu/nccl_check.py: NCCL's all_reduce near the cap, alone, two
#                 ranks on one GPU, two members of a pool (PyTorch; else the driver
#                 stand-in for NCCL's cuMemCreate buffers)
#   vllm-sizing   graphs.py vllm: a cache of 0.9 x the total, filled, then a CUDA graph
#   pool-64       scripts/gpu/pool_storm.py pool-64: POOL_MEMBERS (64) processes at once
#   kill-storm    pool_storm.py kill-storm: holders SIGKILLed while others allocate
#   fork-hold     pool_storm.py fork-hold: a member SIGKILLed while its forked child (no
#                 CUDA) lives; its memory, the driver's while the child holds the device
#                 files, is not served again until the child is gone
#   bench-step    (with --bench) scripts/gpu/step_cost.py: raw, gpucap, pool and HAMi-core
#                 (target/hami/libvgpu.so, where carried) in 8 rotating rounds; the JSON
#                 to LOGDIR/step-cost.json
# shellcheck disable=SC2317

CHECKS+=(graphs graphs-torch nccl vllm-sizing pool-64 kill-storm fork-hold)
BENCHES+=(bench-step)

check_graphs() {
    needs_py "$1" || return
    probe "$CLI" run --limit "$CAP" -- "$PY" "$SRC_DIR/graphs.py" graphs --cap "$CAP"
    verdict "$1"
}

check_graphs_torch() {
    needs_fw torch "$1" || return
    probe "$CLI" run --limit "$CAP" -- "$PY" "$SRC_DIR/graphs.py" torch-graph --cap "$CAP"
    verdict "$1"
}

check_nccl() {
    needs_py "$1" || return
    local client=driver
    if fw_available torch; then
        client=torch
    fi
    probe "$PY" "$SRC_DIR/nccl_check.py" --cli "$CLI" --cap "$CAP" --client "$client" --timeout $((TIMEOUT / 2))
    verdict "$1"
}

check_vllm_sizing() {
    needs_py "$1" || return
    probe "$CLI" run --limit "$CAP" -- "$PY" "$SRC_DIR/graphs.py" vllm --cap "$CAP"
    verdict "$1"
}

check_pool_64() {
    needs_py "$1" || return
    probe "$PY" "$SRC_DIR/pool_storm.py" pool-64 --cli "$CLI" --members "$POOL_MEMBERS" --timeout $((TIMEOUT / 2))
    verdict "$1"
}

check_kill_storm() {
    needs_py "$1" || return
    probe "$PY" "$SRC_DIR/pool_storm.py" kill-storm --cli "$CLI" --timeout $((TIMEOUT / 2))
    verdict "$1"
}

check_fork_hold() {
    needs_py "$1" || return
    probe "$PY" "$SRC_DIR/pool_storm.py" fork-hold --cli "$CLI" --timeout $((TIMEOUT / 2))
    verdict "$1"
}

check_bench_step() {
    needs_py "$1" || return
    local lb=() torch=() cap=$CAP deadline=$(($(date +%s) + TIMEOUT - 15))
    if [ -n "$NVCC" ]; then
        build "$1" "$BUILD/launchbench" "$SRC_DIR/launchbench.cu" -lcuda || return
        lb=(--launchbench "$BUILD/launchbench")
    fi
    if fw_available torch; then
        torch=(--torch)
    fi
    if [ -z "$NVCC" ] && [ -z "${torch[*]}" ]; then
        skip "$1" "neither nvcc nor PyTorch here: nothing to time"
        return
    fi
    # twice the cap where the card allows: room for the context, cuDNN and the model
    if [ $((2 * CAP_MIB)) -le $((TOTAL_MIB / 2)) ]; then
        cap=$((2 * CAP))
    fi
    if [ -n "$DEADLINE" ] && [ "$DEADLINE" -lt "$deadline" ]; then
        deadline=$DEADLINE
    fi
    probe "$PY" "$SRC_DIR/step_cost.py" --cli "$CLI" --cap "$cap" --out "$LOGDIR/step-cost.json" \
        --hami "$ROOT/target/hami/libvgpu.so" --rounds "$STEP_ROUNDS" --deadline "$deadline" \
        --timeout $((TIMEOUT / 4 > 60 ? TIMEOUT / 4 : 60)) ${lb[@]+"${lb[@]}"} ${torch[@]+"${torch[@]}"}
    verdict "$1"
}
