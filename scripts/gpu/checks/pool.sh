# shellcheck shell=bash
# Checks of scripts/gpu-check.sh (sourced by it): a pool of four members on the GPU,
# `gpucap metrics` scraped while they run, nvidia-smi and NVML from another PID
# namespace (scripts/gpu/pool_check.py runs the members once; each check reports its
# part). Members are PyTorch processes where PyTorch works, else the driver API
# through ctypes (the fake GPU in CI): the same choreography either way.
# pool-contexts (scripts/gpu/pool_contexts.py, the driver API through ctypes everywhere):
# a member makes and destroys contexts while three others churn; its contexts are never
# charged short, and the driver's figure for the pool never passes the cap.
# shellcheck disable=SC2317

POOL_CHECKS=(pool pool-metrics pool-pidns pool-contexts)
CHECKS+=("${POOL_CHECKS[@]}")

POOL_DONE=0 POOL_OUT=
# pool_run NAME: runs the pool scenario once; its output in POOL_OUT.
pool_run() {
    if [ "$POOL_DONE" = 1 ]; then
        cat "$POOL_OUT" >>"$LOG"
        return
    fi
    POOL_DONE=1
    POOL_OUT=$LOGDIR/pool.out
    : >"$POOL_OUT"
    if [ "$PY_OK" != 1 ]; then
        echo "PART all SKIP: no Python 3 ('$PY' not found) to drive the members" >"$POOL_OUT"
        return
    fi
    local client=driver pidns=()
    if fw_available torch; then
        client=torch
    fi
    # four contexts (PyTorch's take hundreds of MiB each) and four blocks: four caps
    local cap=$((4 * CAP))
    if [ $((4 * CAP_MIB)) -gt $((TOTAL_MIB / 2)) ]; then
        cap=$CAP
    fi
    if ! unshare -pf --mount-proc true >/dev/null 2>&1; then
        pidns=(--no-pidns "unshare -pf --mount-proc is not permitted here (needs root or user namespaces)")
    fi
    run_logged "$POOL_OUT" "$PY" "$SRC_DIR/pool_check.py" --cli "$CLI" --cap "$cap" --client "$client" \
        --python "$PY" --uuid "$GPU_UUID" --timeout $((TIMEOUT / 2)) --keep "$LOGDIR/pool" \
        ${pidns[@]+"${pidns[@]}"}
}

# pool_part NAME: the verdict of one part of the pool run.
pool_part() {
    local line
    pool_run "$1"
    line=$(grep -E "^PART ($1|all) (OK|FAIL|SKIP): " "$POOL_OUT" | tail -n 1)
    case $line in
        "PART "*" OK: "*) pass "$1" "${line#*OK: }" ;;
        "PART "*" SKIP: "*) skip "$1" "${line#*SKIP: }" ;;
        "PART "*" FAIL: "*) fail "$1" "${line#*FAIL: }" ;;
        *) fail "$1" "the pool run printed no verdict for $1 (timed out after ${TIMEOUT}s?)" ;;
    esac
}
check_pool() { pool_part "$1"; }
check_pool_metrics() { pool_part "$1"; }
check_pool_pidns() { pool_part "$1"; }

# pool-contexts: its own pool, sized from what a context takes here; about 15 s.
check_pool_contexts() {
    if [ "$PY_OK" != 1 ]; then
        skip "$1" "no Python 3 ('$PY' not found) to drive the members"
        return
    fi
    probe "$PY" "$SRC_DIR/pool_contexts.py" --cli "$CLI" --seconds 10 --timeout $((TIMEOUT / 2)) \
        --keep "$LOGDIR/pool-contexts"
    verdict "$1"
}
