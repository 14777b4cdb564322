#!/usr/bin/env bash
# under.sh RUNS [KEY=VAL...]: member 1 raises its stack by 396 MiB and lowers it again
# (PS_OP=stack PS_OPK=3) PS_OPN times while members 2..P do PS_OPOTHERS (or churn with
# PS_KIND); every "holds N MiB" below 396 is a stack charged short (the pool may then hold
# more than its cap). Prints the distribution of the charges per run.
cd "$(dirname "$0")/../../.." || exit 9
runs=${1:-8}; shift || true
under_runs=0
for r in $(seq 1 "$runs"); do
    out=$(KEEP=1 GPUCAP_LOG=debug scripts/dev/pool-stress/run.sh ${P:-4} GPUCAP_LIMIT=${CAP:-8Gi} FAKECUDA_TOTAL_MEM=16Gi PS_OP=stack PS_OPK=3 PS_OPWHO=1 PS_OPN=${N:-40} PS_OPGAP=5 "$@" 2>&1)
    dir=$(echo "$out" | grep -o 'dir=[^ ]*' | cut -d= -f2)
    stats=$(grep -ho "limit 0 = 2560 holds [0-9.]* [MG]iB" "$dir"/err.1 | awk '{v=$6; if ($7=="GiB") v*=1024; n++; if (v<396) {u++; if (min==""||v<min) min=v} if (v>396) o++} END {printf "%d raises: %d under (least %s MiB), %d over", n, u, min, o}')
    okn=$(grep -ho "^op stack ok=[0-9]*" "$dir"/out.1 | grep -o "[0-9]*$")
    held=$(echo "$stats" | grep -o "^[0-9]*")
    zero=$(( ${okn:-0} - ${held:-0} ))
    stats="$stats, $zero charged 0 B"
    { echo "$stats" | grep -q " 0 under" && [ "$zero" -le 0 ]; } || under_runs=$((under_runs + 1))
    echo "run $r: $stats; $(echo "$out" | grep -o 'ok=[0-9]* refused=[0-9]* errors=[0-9]*') $(echo "$out" | grep -o 'peak0=[0-9]*MiB[(OVER)]*') $(grep -h '^op' "$dir"/out.* | sort | uniq -c | tr -s ' ' | tr '\n' ';')"
    [ "${KEEPDIR:-0}" = 1 ] && echo "  kept $dir" || rm -rf "$dir"
done
echo "runs with an under-charged stack: $under_runs of $runs"
