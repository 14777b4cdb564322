#!/usr/bin/env bash
# Finding 2: cuCtxSetLimit(STACK) measured device-wide while members churn (its own
# threads included) is charged far above what the fake's stack takes (132 MiB) and
# refused far below the cap. 4 members x (2 threads x 4 x 8 MiB + 132 MiB stack) =
# 784 MiB of a 1 GiB cap: every "stack 1 -> 2" is a false refusal.
cd "$(dirname "$0")/../../.." || exit 9
runs=${1:-10}; shift || true
bad=0
for r in $(seq 1 "$runs"); do
    out=$(scripts/dev/pool-stress/run.sh 4 PS_THREADS=2 PS_MAX=8Mi PS_FIXED=1 PS_FREEP=30 PS_MS=2000 PS_STACK=1 "$@" 2>&1)
    n=$(echo "$out" | grep -c "stack 1 -> 2")
    [ "$n" -gt 0 ] && bad=$((bad + 1))
    echo "run $r: $n of 4 stack raises refused; $(echo "$out" | grep -o 'peak0=[0-9]*MiB[(OVER)]*')"
    echo "$out" | grep "refused cuCtxSetLimit" | head -1 | cut -c1-200
done
echo "false refusals in $bad of $runs runs"
