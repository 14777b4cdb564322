#!/usr/bin/env bash
# start-storm.sh: processes starting in storms on the fake GPU, for as long as asked, to run
# tests beside (a test that fails one run in N under load is a bug). Each storm is
# tests/c/bench_start.c starting N processes at once (raw: no shim), each making its
# context and taking 1 MiB, then letting them all go; the next storm follows at once. A
# 2-core machine is then saturated with hundreds of processes that fork, load, start and
# exit, the load a real mass start puts beside a pool's members.
#
#   scripts/dev/start-storm.sh [--seconds S] [-n N]      # defaults: 300 s, 2,000
#
# Beside a test binary, for example (what found two test bugs, 2026-12-06: 5 and 1 failed
# runs in 36 and 60 of the pool-file crate's tests, none without the storm):
#
#   scripts/dev/start-storm.sh --seconds 600 &
#   t=$(ls target/release/deps/gpucap_pool_file-* | grep -v '\.d$')   # cargo test --release --no-run
#   for i in $(seq 20); do for j in 1 2 3; do "$t" -q & done; wait; done
#
# Needs `cargo build --release` done and cc. Prints how many storms ran.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=300 n=2000
while [ $# -gt 0 ]; do
    case $1 in
        --seconds) seconds=${2:?--seconds needs a number}; shift 2 ;;
        -n) n=${2:?-n needs a number}; shift 2 ;;
        *) echo "start-storm.sh: unknown argument $1 (accepted: --seconds S, -n N)" >&2; exit 2 ;;
    esac
done
case $seconds$n in *[!0-9]*) echo "start-storm.sh: --seconds and -n take whole numbers" >&2; exit 2 ;; esac
R=$PWD/target/release
[ -f "$R/libcuda.so" ] || { echo "start-storm.sh: $R/libcuda.so missing: run cargo build --release first" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
ln -s "$R/libcuda.so" "$tmp/libcuda.so.1"
ln -s "$R/libcuda.so" "$tmp/libcuda.so"
cc -O2 -Wall -Werror -I tests/c -o "$tmp/bench_start" tests/c/bench_start.c -L "$tmp" -lcuda
export LD_LIBRARY_PATH=$tmp FAKECUDA_TOTAL_MEM=80Gi
storms=0
end=$((SECONDS + seconds))
while [ $SECONDS -lt $end ]; do
    "$tmp/bench_start" "$n" >/dev/null 2>&1 || true
    storms=$((storms + 1))
done
echo "start-storm.sh: $storms storms of $n processes in $seconds s"
