#!/usr/bin/env bash
# stack-refuse.sh RUNS [KEY=VAL...]: 4 members churn 2 threads x <=4 x 8 MiB (256 MiB) under a
# 2 GiB cap; each raises its stack once by 396 MiB (PS_OPK=3) and keeps it: 4 x 396 + 256 =
# 1840 MiB < 2048, so every refused cuCtxSetLimit is a false refusal. Prints per run the
# refusals, the charges logged and the fake's peak.
cd "$(dirname "$0")/../../.." || exit 9
runs=${1:-8}; shift || true
bad=0
under=0
for r in $(seq 1 "$runs"); do
    out=$(KEEP=1 GPUCAP_LOG=debug scripts/dev/pool-stress/run.sh 4 GPUCAP_LIMIT=2Gi PS_THREADS=2 PS_MAX=8Mi PS_FIXED=1 PS_FREEP=30 PS_MS=2000 PS_OP=stackup PS_OPK=3 "$@" 2>&1)
    dir=$(echo "$out" | grep -o 'dir=[^ ]*' | cut -d= -f2)
    n=$(grep -h "^op stackup" "$dir"/out.* | grep -c "oom=1")
    [ "$n" -gt 0 ] && bad=$((bad + 1))
    ch=$(grep -ho "holds [0-9.]* [KMG]iB" "$dir"/err.* | sort | uniq -c | tr '\n' ';' | tr -s ' ')
    echo "run $r: $n of 4 refused; charged $ch $(echo "$out" | grep -o 'peak0=[0-9]*MiB[(OVER)]*')"
    grep -h "refused cuCtxSetLimit" "$dir"/err.* | head -1 | cut -c1-170
    if grep -ho "holds [0-9.]* MiB" "$dir"/err.* | awk '$2 < 396 {u=1} END {exit !u}'; then
        echo "UNDER-CHARGED: kept $dir"; under=$((under + 1))
    else rm -rf "$dir"; fi
done
echo "false refusals in $bad of $runs runs; under-charged stacks in $under"
