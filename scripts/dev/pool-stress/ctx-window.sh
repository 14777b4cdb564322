#!/usr/bin/env bash
# Finding 1: a context made while other pool members churn (no other context in flight)
# is charged the device-wide window, hundreds of MiB to GiB above what the driver took
# (64 MiB here), and the pool refuses far below its cap. 6 members x (64 MiB context +
# 2 threads x 4 x 8 MiB) = 768 MiB of a 1 GiB cap: every refusal is a false one.
# Usage: scripts/dev/pool-stress/ctx-window.sh [RUNS] [extra KEY=VAL for run.sh, e.g. ALONE=1]
cd "$(dirname "$0")/../../.." || exit 9
runs=${1:-10}; shift || true
bad=0
for r in $(seq 1 "$runs"); do
    out=$(scripts/dev/pool-stress/run.sh 6 PS_THREADS=2 PS_MAX=8Mi PS_FIXED=1 PS_FREEP=30 PS_MS=2000 \
        FAKECUDA_CONTEXT_MEM=64Mi FAKECUDA_CONTEXT_DELAY_MS=200 NOBARRIER=1 GAPMS=150 "$@" 2>&1)
    if echo "$out" | grep -q "refused=[1-9]\|ctx 2"; then bad=$((bad + 1)); fi
    echo "run $r: $(echo "$out" | grep -o 'refused=[0-9]*') $(echo "$out" | grep -c 'ctx 2') ctx-refused; $(echo "$out" | grep -o 'peak0=[0-9]*MiB[(OVER)]*')"
    echo "$out" | grep "refused cuDevicePrimaryCtxRetain\|refused cuMemAlloc" | head -2 | cut -c1-200
done
echo "false refusals in $bad of $runs runs"
