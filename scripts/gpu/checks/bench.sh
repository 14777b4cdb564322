# shellcheck shell=bash
# The benchmarks of scripts/gpu-check.sh --bench (sourced by it; its BENCHES list names
# them): raw, gpucap and growth mode interleaved, medians; bench_summary writes the JSON.
# shellcheck disable=SC2317

# bench_run GROUP KEY MODE CMD...: one run, raw / under gpucap / in growth mode; appends
# "GROUP KEY MODE VALUE" to the results. Returns 1 (message in PROBE_MSG) on failure.
bench_run() {
    local group=$1 key=$2 mode=$3 out=$LOGDIR/.out value
    shift 3
    local pre=() cap=${BENCH_CAP:-$CAP}
    case $mode in
        gpucap) pre=("$CLI" run --limit "$cap" --) ;;
        growth) pre=("$CLI" run --growth --limit "$cap" --) ;;
    esac
    run_logged "$out" ${pre[@]+"${pre[@]}"} "$@"
    local rc=$?
    value=$(sed -n 's/^RESULT \([0-9][0-9.]*\).*/\1/p' "$out" | tail -n 1)
    if [ "$rc" != 0 ] || [ -z "$value" ]; then
        PROBE_MSG=$(grep -E '^FAIL: ' "$out" | tail -n 1 | sed 's/^FAIL: //')
        case $rc in
            124 | 137) PROBE_MSG="timed out after ${TIMEOUT}s" ;;
        esac
        PROBE_MSG="$mode run of $group $key: ${PROBE_MSG:-exit status $rc, no RESULT line}"
        return 1
    fi
    printf '%s %s %s %s\n' "$group" "$key" "$mode" "$value" >>"$BENCH_TSV"
    printf '   %-6s %-10s %-7s %s\n' "$group" "$key" "$mode" "$value" >>"$LOGDIR/bench-progress.txt"
}

size_label() { # BYTES: 4 KiB, 1 MiB, ...
    if [ "$1" -ge 1048576 ]; then
        printf '%d MiB' $(($1 / 1048576))
    else
        printf '%d KiB' $(($1 / 1024))
    fi
}

median_of() { # GROUP KEY MODE: the median of the values recorded so far
    awk -v g="$1" -v k="$2" -v m="$3" '$1 == g && $2 == k && $3 == m { v[n++] = $4 }
        END { if (n == 0) { print "-"; exit }
              for (i = 1; i < n; i++) { t = v[i]; for (j = i - 1; j >= 0 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
              printf "%.1f\n", (n % 2) ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2 }' "$BENCH_TSV"
}

check_bench_alloc() {
    build_drvbench "$1" || return
    local size rep mode summary=""
    for size in 4096 1048576 268435456; do
        for ((rep = 1; rep <= REPS; rep++)); do
            for mode in raw gpucap growth; do
                if ! bench_run pair "$size" "$mode" "$DRVBENCH" pair "$size" "$TARGET_MS"; then
                    fail "$1" "$PROBE_MSG"
                    return
                fi
            done
        done
        summary+="$(size_label "$size"): $(median_of pair "$size" raw) / $(median_of pair "$size" gpucap) / $(median_of pair "$size" growth) ns; "
    done
    pass "$1" "ns per cuMemAlloc+cuMemFree, raw / gpucap / growth: ${summary%; }"
}

CHURN_MAX=$((32 * 1048576))
check_bench_churn() {
    build_drvbench "$1" || return
    # 32 live blocks of up to CHURN_MAX bytes must fit well within the cap
    while [ $((32 * CHURN_MAX)) -gt $((CAP / 2)) ] && [ "$CHURN_MAX" -gt 262144 ]; do
        CHURN_MAX=$((CHURN_MAX / 2))
    done
    local rep mode
    for ((rep = 1; rep <= REPS; rep++)); do
        for mode in raw gpucap growth; do
            if ! bench_run churn mixed "$mode" "$DRVBENCH" churn "$TARGET_MS" "$CHURN_MAX"; then
                fail "$1" "$PROBE_MSG"
                return
            fi
        done
    done
    pass "$1" "ns per free+alloc, raw / gpucap / growth: $(median_of churn mixed raw) / $(median_of churn mixed gpucap) / $(median_of churn mixed growth)"
}

check_bench_torch_train() {
    needs_fw torch "$1" || return
    local rep m mode cap=$CAP
    # twice the cap where the card allows: room for the CUDA context and cuDNN
    if [ $((2 * CAP_MIB)) -le $((TOTAL_MIB / 2)) ]; then
        cap=$((2 * CAP))
    fi
    TRAIN_CAP=$cap
    local modes=(raw gpucap growth)
    for ((rep = 1; rep <= TRAIN_REPS; rep++)); do
        # each rep starts with another mode: no mode always runs first (on the first H200
        # run raw always ran first, and the modes differed as much as their runs spread)
        for ((m = 0; m < 3; m++)); do
            mode=${modes[$(((rep - 1 + m) % 3))]}
            if ! BENCH_CAP=$cap bench_run train resnet18 "$mode" "$PY" "$PROBE" train --steps "$TRAIN_STEPS" \
                --warmup "$TRAIN_WARMUP" --batch "$TRAIN_BATCH" --image "$TRAIN_IMAGE"; then
                fail "$1" "$PROBE_MSG"
                return
            fi
        done
    done
    pass "$1" "ms per step, raw / gpucap / growth: $(median_of train resnet18 raw) / $(median_of train resnet18 gpucap) / $(median_of train resnet18 growth)"
}

bench_summary() {
    LOG=$LOGDIR/bench-summary.log
    if [ "$PY_OK" != 1 ]; then
        fail bench-summary "no Python 3 ('$PY' not found) to write $OUT; raw figures in $BENCH_TSV"
        return
    fi
    local nvcc_version="" versions=() fw
    if [ -n "$NVCC" ]; then
        nvcc_version=$("$NVCC" --version 2>/dev/null | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -n 1)
    fi
    for fw in torch jax cupy; do
        if [ "${FW_STATE[$fw]:-}" = yes ]; then
            versions+=(--meta "version_$fw=${FW_MSG[$fw]}")
        fi
    done
    run_logged "$LOGDIR/.out" "$PY" "$PROBE" bench-summary --tsv "$BENCH_TSV" --out "$OUT" \
        --figures "$FIGURES" --checks "$RESULTS_FILE" \
        --meta "gpu_name=$GPU_NAME" --meta "driver_version=$DRIVER" --meta "memory_total_mib=$TOTAL_MIB" \
        --meta "cuda_toolkit=$nvcc_version" --meta "host=$(uname -m), $(nproc) cores" \
        --meta "cap_bytes=$CAP" --meta "reps=$REPS" --meta "target_ms=$TARGET_MS" \
        --meta "churn_max_bytes=$CHURN_MAX" --meta "train_steps=$TRAIN_STEPS" \
        --meta "train_warmup=$TRAIN_WARMUP" --meta "train_batch=$TRAIN_BATCH" \
        --meta "train_image=$TRAIN_IMAGE" --meta "train_cap_bytes=${TRAIN_CAP:-}" ${versions[@]+"${versions[@]}"}
    local rc=$?
    grep -vE '^(OK|INFO): ' "$LOGDIR/.out"
    if [ "$rc" != 0 ]; then
        fail bench-summary "writing $OUT failed"
    fi
}
