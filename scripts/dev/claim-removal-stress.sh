#!/usr/bin/env bash
# claim-removal-stress.sh: a claim's joiners beside a loop that removes the claim's file
# (and its socket) while its members run, on the fake GPU: every joiner must join the
# members' one budget (a 40 GiB cap, 1 MiB each: any refusal is a joiner refused below
# its cap). Prints `joiners=N refused=M` and exits 1 where any was refused; the refused
# joiners' lines are printed above it. The figures of docs/src/pools.md ("A file removed
# while its members run") were measured so.
#
#   scripts/dev/claim-removal-stress.sh [--joiners J] [--rounds R] [--holders H]
#                                       [--period-ms MS] [--file-only] [--same-netns]
#
# Each round: a fresh claim directory, H members holding (default 1), then J joiners
# (default 20) started at once, each in a network namespace of its own (`unshare --net`:
# no member's announcement seen, so it asks the claim's socket for the file) unless
# --same-netns, beside a loop that removes the file and the socket (the file alone with
# --file-only) every MS milliseconds (default 3) for six seconds. Needs `cargo build
# --release` done, cc, and (without --same-netns) root or user namespaces for unshare.
# GPUCAP_STRESS_SHIM=<path> measures another build of the shim.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
J=20 ROUNDS=4 HOLDERS=1 PERIOD=3 WHAT=both NETNS=(unshare --net)
need() { [ $# -ge 2 ] && [[ $2 =~ ^[0-9]+$ ]] && [ "$2" -ge 1 ] || { echo "claim-removal-stress: $1 needs a whole number from 1 (got '${2:-}')" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
    case $1 in
        --joiners) need "$@"; J=$2; shift 2 ;;
        --rounds) need "$@"; ROUNDS=$2; shift 2 ;;
        --holders) need "$@"; HOLDERS=$2; shift 2 ;;
        --period-ms) need "$@"; PERIOD=$2; shift 2 ;;
        --file-only) WHAT=file; shift ;;
        --same-netns) NETNS=(); shift ;;
        -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "claim-removal-stress: unknown argument '$1' (accepted: --joiners J, --rounds R, --holders H, --period-ms MS, --file-only, --same-netns)" >&2; exit 2 ;;
    esac
done
R=$ROOT/target/release
SHIM=${GPUCAP_STRESS_SHIM:-$R/libgpucap.so}
for f in "$SHIM" "$R/libcuda.so" "$R/libnvidia_ml.so"; do
    [ -f "$f" ] || { echo "claim-removal-stress: $f missing: run cargo build --release" >&2; exit 1; }
done
if [ ${#NETNS[@]} -gt 0 ] && ! "${NETNS[@]}" true 2>/dev/null; then
    echo "claim-removal-stress: cannot make a network namespace (unshare --net): run as root, or pass --same-netns" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$tmp"' EXIT
mkdir "$tmp/fake"
ln -s "$R/libcuda.so" "$tmp/fake/libcuda.so.1"
ln -s "$R/libcuda.so" "$tmp/fake/libcuda.so"
ln -s "$R/libnvidia_ml.so" "$tmp/fake/libnvidia-ml.so.1"
cc -O2 -Wall -Werror -I tests/c -o "$tmp/bench_start" tests/c/bench_start.c -L "$tmp/fake" -lcuda

# A process of the claim DIR: the fake GPU, a 40 GiB cap, the shim.
capped() {
    local dir=$1
    shift
    env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$tmp/fake" FAKECUDA_TOTAL_MEM=80Gi \
        GPUCAP_LIMIT=40Gi GPUCAP_CLAIM_DIR="$dir" LD_PRELOAD="$SHIM" "$@"
}

# Removes the claim's file (and socket) every PERIOD ms for SECS seconds.
removing() {
    local dir=$1 secs=$2 end=$((SECONDS + $2))
    while [ $SECONDS -lt "$end" ]; do
        rm -f "$dir/gpucap.pool"
        [ "$WHAT" = both ] && rm -f "$dir/gpucap.pool.sock"
        sleep "$(printf '0.%03d' "$PERIOD")"
    done
}

total=0 refused=0
for r in $(seq "$ROUNDS"); do
    dir=$tmp/claim.$r
    mkdir -m 777 "$dir"
    # The members hold their blocks until their standard input closes.
    (sleep 20 | capped "$dir" BENCH_START_HOLD=1 "$tmp/bench_start" "$HOLDERS") >"$tmp/hold.$r" 2>&1 &
    holders=$!
    for _ in $(seq 100); do grep -q '^n=' "$tmp/hold.$r" 2>/dev/null && break; sleep 0.05; done
    grep -q 'failed=0' "$tmp/hold.$r" || { echo "claim-removal-stress: the members did not start:" >&2; cat "$tmp/hold.$r" >&2; exit 1; }
    removing "$dir" 6 &
    loop=$!
    pids=()
    for j in $(seq "$J"); do
        (capped "$dir" "${NETNS[@]}" "$tmp/bench_start" once; echo "rc=$?") >"$tmp/j.$r.$j" 2>&1 &
        pids+=($!)
    done
    wait "${pids[@]}"
    kill "$loop" 2>/dev/null || true
    { wait "$loop"; } 2>/dev/null || true
    for j in $(seq "$J"); do
        total=$((total + 1))
        if ! grep -q '^rc=0' "$tmp/j.$r.$j"; then
            refused=$((refused + 1))
            echo "round $r, joiner $j:"
            grep -v '^rc=' "$tmp/j.$r.$j" | head -3
        fi
    done
    pkill -P "$holders" 2>/dev/null || true
    kill "$holders" 2>/dev/null || true
    { wait "$holders"; } 2>/dev/null || true
done
echo "joiners=$total refused=$refused"
[ "$refused" = 0 ]
