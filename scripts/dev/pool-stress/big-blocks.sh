#!/usr/bin/env bash
# big-blocks.sh RUNS [KEY=VAL...]: 4 members each churn one thread of 256 MiB blocks (at most
# one held: 1 GiB) under a 2 GiB pool cap; member 1 raises its stack by 792 MiB (PS_OPK=6)
# once and keeps it: 1,816 MiB < 2,048 at most, so a refused raise is a false refusal.
cd "$(dirname "$0")/../../.." || exit 9
runs=${1:-8}; shift || true
bad=0
for r in $(seq 1 "$runs"); do
    out=$(scripts/dev/pool-stress/run.sh 4 GPUCAP_LIMIT=2Gi PS_THREADS=1 PS_MAX=256Mi PS_FIXED=1 PS_HOLD=1 PS_MS=2000 PS_OP=stackup PS_OPK=6 PS_OPWHO=1 "$@" 2>&1)
    echo "$out" | grep -q "op stackup ok=0" && bad=$((bad + 1))
    echo "run $r: $(echo "$out" | grep -o 'op stackup.*first' | head -1) $(echo "$out" | grep -o 'peak0=[0-9]*MiB[(OVER)]*') $(echo "$out" | grep -o 'refused cuCtxSetLimit.*in use' | head -1)"
done
echo "stack raise refused in $bad of $runs runs"
