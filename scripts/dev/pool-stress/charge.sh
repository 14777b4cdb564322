#!/usr/bin/env bash
# charge.sh RUNS OP [KEY=VAL...]: P members churn (run.sh), member 1 makes PS_OP once (kept:
# stackup/global with no unload...) and the shim's debug line says what it was charged.
# Prints per run the charges gpucap logged for the op ("holds"/"takes") and refusals.
cd "$(dirname "$0")/../../.." || exit 9
runs=${1:-8}; op=${2:-stackup}; shift 2
for r in $(seq 1 "$runs"); do
    out=$(KEEP=1 GPUCAP_LOG=debug scripts/dev/pool-stress/run.sh ${P:-4} PS_OP=$op PS_OPWHO=${OPWHO:-1} "$@" 2>&1)
    dir=$(echo "$out" | grep -o 'dir=[^ ]*' | cut -d= -f2)
    ch=$(grep -ho "limit 0 = [0-9]* holds [0-9.]* [KMG]iB\|the module takes [0-9.]* [KMG]iB\|first use loaded [0-9.]* [KMG]*i*B\|takes [0-9.]* [KMG]iB on GPU" "$dir"/err.* | sort | uniq -c | tr '\n' ';')
    ref=$(grep -h "refused" "$dir"/err.* | grep -v "refused cuMem" | cut -c1-150 | head -2 | tr '\n' ';')
    echo "run $r: $(echo "$out" | grep -o 'ok=[0-9]* refused=[0-9]*') $(echo "$out" | grep -o 'peak0=[0-9]*MiB[(OVER)]*') charged: $ch $ref"
    rm -rf "$dir"
done
