#!/usr/bin/env bash
# run.sh P [KEY=VAL...]: P pool members (pstress.c here) churning together on a shared
# fake GPU; prints the members' results, the refusal lines and the fake's shared peak
# per GPU (the driver's figure for all processes together) against the cap.
# Environment passes through (GPUCAP_*, FAKECUDA_*, PS_*); defaults below.
# KILL=N: SIGKILL N random members (of KILLFROM..P) at random moments (respawned); STOP=N: SIGSTOP N
# members for STOPMS ms each. ALONE=1: no GPUCAP_POOL (each capped alone).
set -u
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
BIN=$ROOT/target/release
P=${1:-4}
shift || true
for kv in "$@"; do export "$kv"; done
mkdir -p "$ROOT/target/stress"
if [ ! -x "$ROOT/target/stress/pstress" ] || [ "$ROOT/scripts/dev/pool-stress/pstress.c" -nt "$ROOT/target/stress/pstress" ]; then
    cc -O1 -g -Wall -pthread -I "$ROOT/tests/c" -o "$ROOT/target/stress/pstress" "$ROOT/scripts/dev/pool-stress/pstress.c" -L "$BIN" -lcuda -ldl || exit 9
fi
D=$(mktemp -d /tmp/ps-run.XXXXXX)
export LD_LIBRARY_PATH=$BIN/fake-gpu
export FAKECUDA_SHARED=$D/fake-gpu FAKECUDA_TOTAL_MEM=${FAKECUDA_TOTAL_MEM:-8Gi}
export GPUCAP_LIMIT=${GPUCAP_LIMIT:-1Gi} GPUCAP_POOL_DIR=$D
[ "${ALONE:-0}" = 1 ] || export GPUCAP_POOL=${GPUCAP_POOL:-t}
export PS_READY_DIR=$D
[ "${NOBARRIER:-0}" = 1 ] || export PS_GO=$D/go
cap_bytes=$(python3 -c "import re,sys;s='$GPUCAP_LIMIT';m=re.match(r'([0-9.]+)(\w*)',s);u={'':1,'Ki':1<<10,'Mi':1<<20,'Gi':1<<30};print(int(float(m[1])*u[m[2]]))")
pids=()
spawn() {
    local i=$1
    PS_MEMBER=$i PS_READY=$D/ready.$i LD_PRELOAD=${SHIM:-$BIN/libgpucap.so} ${WRAP:-} "$ROOT/target/stress/pstress" >>"$D/out.$i" 2>>"$D/err.$i" &
    pids[$i]=$!
}
for i in $(seq 1 "$P"); do spawn "$i"; [ -n "${GAPMS:-}" ] && sleep "$(python3 -c "print(${GAPMS}/1000)")"; done
# Barrier: every member made its context (or failed) before anyone churns.
for _ in $(seq 1 3000); do
    n=$(ls "$D"/ready.* 2>/dev/null | wc -l)
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=$((alive + 1)); done
    [ "$n" -ge "$alive" ] && break
    sleep 0.01
done
touch "$D/go"
if [ "${KILL:-0}" -gt 0 ] || [ "${STOP:-0}" -gt 0 ]; then
    for k in $(seq 1 "${KILL:-0}"); do
        sleep "0.0$((RANDOM % 9 + 1))"
        i=$((RANDOM % (P - ${KILLFROM:-1} + 1) + ${KILLFROM:-1}))
        kill -KILL "${pids[$i]}" 2>/dev/null
        wait "${pids[$i]}" 2>/dev/null
        echo "killed" >>"$D/out.$i"
        spawn "$i"
    done
    for k in $(seq 1 "${STOP:-0}"); do
        sleep "0.0$((RANDOM % 9 + 1))"
        i=$((RANDOM % P + 1))
        kill -STOP "${pids[$i]}" 2>/dev/null
        sleep "$(python3 -c "print(${STOPMS:-500}/1000)")"
        kill -CONT "${pids[$i]}" 2>/dev/null
    done
fi
rc_all=0
for i in $(seq 1 "$P"); do
    if [ -n "${TIMEOUT:-}" ]; then
        timeout "$TIMEOUT" tail --pid="${pids[$i]}" -f /dev/null || { echo "HANG member $i pid ${pids[$i]}"; rc_all=1; }
    fi
    wait "${pids[$i]}"
    rc=$?
    [ $rc = 0 ] || { echo "member $i exit $rc"; rc_all=1; }
done
cat "$D"/out.* | grep -v '^killed' | awk '{for(i=1;i<=NF;i++){split($i,a,"=");if(a[1]=="ok")ok+=a[2];if(a[1]=="refused")rf+=a[2];if(a[1]=="errors")er+=a[2]}} END{printf "ok=%d refused=%d errors=%d\n",ok,rf,er}'
grep -h "ctx\|cuInit\|stack" "$D"/out.* | head -5
grep -h "^op " "$D"/out.* | sort | uniq -c
grep -h "gpucap" "$D"/err.* | sort | uniq -c | sort -rn | head -${LINES_SHOWN:-6}
peaks=$(python3 - "$D/fake-gpu" "$cap_bytes" <<'EOF'
import struct,sys
b=open(sys.argv[1],'rb').read(128)
cap=int(sys.argv[2])
out=[]
for d in range(2):
    p=struct.unpack_from('<Q',b,64+8*d)[0]
    out.append(f"peak{d}={p/2**20:.0f}MiB{'(OVER)' if p>cap else ''}")
print(' '.join(out))
EOF
)
echo "$peaks cap=$((cap_bytes >> 20))MiB dir=$D"
[ "${KEEP:-0}" = 1 ] || rm -rf "$D"
case "$peaks" in *OVER*) exit 2 ;; esac
exit $rc_all
