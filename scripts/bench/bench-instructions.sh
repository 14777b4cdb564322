#!/usr/bin/env bash
# Instructions the shim adds per cuMemAlloc_v2 + cuMemFree_v2 pair, counted by
# valgrind's callgrind on the fake driver: deterministic, unlike wall-clock time on a
# driver whose allocation is an mmap.
#
#   scripts/bench/bench-instructions.sh [N] [LIVE...]   # N pairs (default 2000), then 2N;
#                                                 # LIVE: allocations kept live
#                                                 # (default 0 10000 100000 1000000)
#   BSIZES="4Ki 1Mi" (default): the block sizes of the live cases
#   BENCH_SHIM=<path>: measure another build of libgpucap.so (say, an older one): every
#                      row, the pool's guaranteed neighbour too
#   BENCH_JSON=<path>: where the figures go (default target/bench-instructions.json)
#   BENCH_ONLY=pair: only the first rows (raw, gpucap alone, in a pool), of blocks of
#                    BSIZE (default 4Ki); the JSON has those figures only
#                    (tests/bench/bench_instructions.rs checks the published ones with it)
#   BENCH_ONLY=launch: only the kernel launch rows (raw, gpucap); the JSON has those
#                    figures only (tests/bench/bench_instructions.rs checks the book's)
#
# For each of raw driver, LD_PRELOAD=libgpucap.so (GPUCAP_LIMIT set, so the ledger
# is live) and the same in a pool (GPUCAP_POOL): total instructions of `bench_alloc 1 N` and `bench_alloc 1 2N`; their
# difference / N is the cost of one pair with set-up and exit cancelled out. Then the
# same without a pool with LIVE allocations made first and kept (`bench_alloc ... live=K`:
# the live-allocation map holds K entries while the pairs run; 1,000,000 takes a few
# minutes under valgrind), and again with each pair freeing one of the live blocks and
# making it again, round robin (`rotate`: the map met at many keys, not at one), for each
# block size of BSIZES: the pair's block and the live
# ones have that size, so their addresses are spaced by it (the fake GPU is made 4 TiB
# for these, which it only counts; a case whose live blocks would map more than
# valgrind's 128 GiB of client address space is skipped and says so). Also: two visible GPUs (the device each thread remembers,
# hooks/current.rs) and two threads (valgrind runs threads one at a time, so this counts
# instructions, not contention: scripts/bench/bench.sh measures that in ns), and a kernel launch after
# its first (bench_alloc's "launch"). Prints both and the difference; writes
# target/bench-instructions.json. Needs valgrind (apt-get install valgrind) and a
# release build (cargo build --release). Also a pool member with a guarantee and a
# ceiling, beside a live member holding a guarantee.
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-2000}
shift || true
LIVE=("$@")
[ ${#LIVE[@]} -gt 0 ] || LIVE=(0 10000 100000 1000000)
read -r -a BSIZES <<<"${BSIZES:-4Ki 1Mi}"
R=$PWD/target/release
SHIM=${BENCH_SHIM:-$R/libgpucap.so}
JSON=${BENCH_JSON:-$PWD/target/bench-instructions.json}
. scripts/bench/bench-lib.sh
bench_prepare bench-instructions "$SHIM" valgrind
bench_netns bench-instructions

# A kernel launch after its first (bench_alloc's "launch"): the lookup in the functions
# seen, on every launch a program makes.
launch_row() {
    lraw1=$(instructions "" "$N" 0 MODE=launch); lraw2=$(instructions "" $((2 * N)) 0 MODE=launch)
    lshim1=$(instructions "$SHIM" "$N" 0 MODE=launch); lshim2=$(instructions "$SHIM" $((2 * N)) 0 MODE=launch)
    launch_raw=$(((lraw2 - lraw1) / N)); launch_shim=$(((lshim2 - lshim1) / N))
    printf 'a kernel launch (after its first): raw %d, gpucap %d, added %d\n' "$launch_raw" "$launch_shim" \
        $((launch_shim - launch_raw))
}
if [ "${BENCH_ONLY:-}" = launch ]; then
    launch_row
    printf '{"launches":%d,"launch_raw":%d,"launch_gpucap":%d,"launch_added":%d}\n' \
        "$N" "$launch_raw" "$launch_shim" $((launch_shim - launch_raw)) >"$JSON"
    exit 0
fi
raw1=$(instructions "" "$N" 0); raw2=$(instructions "" $((2 * N)) 0)
shim1=$(instructions "$SHIM" "$N" 0); shim2=$(instructions "$SHIM" $((2 * N)) 0)
pool1=$(instructions "$SHIM" "$N" 0 GPUCAP_POOL=bench GPUCAP_POOL_DIR="$tmp")
pool2=$(instructions "$SHIM" $((2 * N)) 0 GPUCAP_POOL=bench GPUCAP_POOL_DIR="$tmp")
raw=$(((raw2 - raw1) / N)); shim=$(((shim2 - shim1) / N)); pool=$(((pool2 - pool1) / N))
printf 'instructions per pair (callgrind, N=%d): raw %d, gpucap %d, added %d; in a pool (GPUCAP_POOL) %d, added %d\n' \
    "$N" "$raw" "$shim" $((shim - raw)) "$pool" $((pool - raw))
if [ "${BENCH_ONLY:-}" = pair ]; then
    printf '{"pairs":%d,"size":"%s","raw_per_pair":%d,"gpucap_per_pair":%d,"added_per_pair":%d,"pool_per_pair":%d,"pool_added_per_pair":%d}\n' \
        "$N" "${BSIZE:-4Ki}" "$raw" "$shim" $((shim - raw)) "$pool" $((pool - raw)) >"$JSON"
    exit 0
fi
# A member with a guarantee and a ceiling (GPUCAP_GUARANTEE, GPUCAP_CEILING) beside another
# live member holding a guarantee: each reservation also reads the pool's guarantee bits
# and that member's guarantee and use (docs/src/pools.md, "Guarantees and ceilings").
HOLD=$R/ctests/script_ir
cc -O2 -o "$HOLD" tests/c/script.c -Itests/c -L"$FAKEDIR" -lcuda
env LD_LIBRARY_PATH="$FAKEDIR" LD_PRELOAD="$SHIM" FAKECUDA_TOTAL_MEM=80Gi GPUCAP_LIMIT=40Gi \
    GPUCAP_POOL=shares GPUCAP_POOL_DIR="$tmp" GPUCAP_GUARANTEE=4Gi \
    "$HOLD" alloc:1Mi "touch:$tmp/held" "wait:$tmp/done" >/dev/null &
holder=$!
for _ in $(seq 6000); do [ -e "$tmp/held" ] && break; sleep 0.01; done
[ -e "$tmp/held" ] || { echo "bench-instructions: the guaranteed neighbour did not start" >&2; exit 1; }
shares_vars=(GPUCAP_POOL=shares GPUCAP_POOL_DIR="$tmp" GPUCAP_GUARANTEE=8Gi GPUCAP_CEILING=30Gi)
sh1=$(instructions "$SHIM" "$N" 0 "${shares_vars[@]}")
sh2=$(instructions "$SHIM" $((2 * N)) 0 "${shares_vars[@]}")
touch "$tmp/done"
wait "$holder"
shares=$(((sh2 - sh1) / N))
printf 'a pool member with a guarantee and a ceiling, beside a guaranteed member: %d, added %d\n' \
    "$shares" $((shares - raw))
# Two visible GPUs: the device of each allocation is the thread's remembered one
# (hooks/current.rs), not 0 by default.
g2raw1=$(instructions "" "$N" 0 FAKECUDA_DEVICES=2); g2raw2=$(instructions "" $((2 * N)) 0 FAKECUDA_DEVICES=2)
g2shim1=$(instructions "$SHIM" "$N" 0 FAKECUDA_DEVICES=2)
g2shim2=$(instructions "$SHIM" $((2 * N)) 0 FAKECUDA_DEVICES=2)
g2raw=$(((g2raw2 - g2raw1) / N)); g2shim=$(((g2shim2 - g2shim1) / N))
printf 'two visible GPUs: raw %d, gpucap %d, added %d\n' "$g2raw" "$g2shim" $((g2shim - g2raw))
# Two threads (valgrind runs them one at a time: the instructions, not the contention):
# 2 x N and 2 x 2N pairs.
t2raw1=$(instructions "" "$N" 0 THREADS=2); t2raw2=$(instructions "" $((2 * N)) 0 THREADS=2)
t2shim1=$(instructions "$SHIM" "$N" 0 THREADS=2)
t2shim2=$(instructions "$SHIM" $((2 * N)) 0 THREADS=2)
t2raw=$(((t2raw2 - t2raw1) / (2 * N))); t2shim=$(((t2shim2 - t2shim1) / (2 * N)))
printf 'two threads: raw %d, gpucap %d, added %d\n' "$t2raw" "$t2shim" $((t2shim - t2raw))
launch_row
# bytes SIZE: 4Ki, 1Mi, 2Gi or a plain number, in bytes.
bytes() {
    case $1 in
        *Ki) echo $((${1%Ki} << 10)) ;; *Mi) echo $((${1%Mi} << 20)) ;; *Gi) echo $((${1%Gi} << 30)) ;;
        *) echo "$1" ;;
    esac
}
BIG=(FAKECUDA_TOTAL_MEM=4Ti GPUCAP_LIMIT=2Ti)
live_json=
for bs in "${BSIZES[@]}"; do
    for k in "${LIVE[@]}"; do
        if [ $((k * $(bytes "$bs"))) -gt $((120 << 30)) ]; then
            printf 'with %d live allocations of %s: skipped (more than valgrind can map)\n' "$k" "$bs"
            continue
        fi
        if [ "$k" = 0 ] && [ "$bs" = 4Ki ]; then
            lraw=$raw; lshim=$shim
        else
            r1=$(BSIZE=$bs instructions "" "$N" "$k" "${BIG[@]}")
            r2=$(BSIZE=$bs instructions "" $((2 * N)) "$k" "${BIG[@]}")
            s1=$(BSIZE=$bs instructions "$SHIM" "$N" "$k" "${BIG[@]}")
            s2=$(BSIZE=$bs instructions "$SHIM" $((2 * N)) "$k" "${BIG[@]}")
            lraw=$(((r2 - r1) / N)); lshim=$(((s2 - s1) / N))
        fi
        printf 'with %d live allocations of %s: raw %d, gpucap %d, added %d\n' "$k" "$bs" "$lraw" "$lshim" $((lshim - lraw))
        rot=
        if [ "$k" != 0 ]; then
            # The same live set, each pair freeing one of its blocks and making it again
            # (bench_alloc's "rotate"): the map met at many keys, not at the one address
            # the single block gets again and again.
            r1=$(BSIZE=$bs instructions "" "$N" "$k" "${BIG[@]}" MODE=rotate)
            r2=$(BSIZE=$bs instructions "" $((2 * N)) "$k" "${BIG[@]}" MODE=rotate)
            s1=$(BSIZE=$bs instructions "$SHIM" "$N" "$k" "${BIG[@]}" MODE=rotate)
            s2=$(BSIZE=$bs instructions "$SHIM" $((2 * N)) "$k" "${BIG[@]}" MODE=rotate)
            rraw=$(((r2 - r1) / N)); rshim=$(((s2 - s1) / N))
            printf '  rotating over them: raw %d, gpucap %d, added %d\n' "$rraw" "$rshim" $((rshim - rraw))
            rot=",\"rotating_raw_per_pair\":$rraw,\"rotating_gpucap_per_pair\":$rshim,\"rotating_added_per_pair\":$((rshim - rraw))"
        fi
        live_json+="${live_json:+,}{\"size\":\"$bs\",\"live\":$k,\"raw_per_pair\":$lraw,\"gpucap_per_pair\":$lshim,\"added_per_pair\":$((lshim - lraw))$rot}"
    done
done
growth_json=
for size in 64Ki 8Mi; do
    r1=$(BSIZE=$size instructions "" "$N" 0); r2=$(BSIZE=$size instructions "" $((2 * N)) 0)
    g1=$(BSIZE=$size instructions "$SHIM" "$N" 0 GPUCAP_GROWTH=1)
    g2=$(BSIZE=$size instructions "$SHIM" $((2 * N)) 0 GPUCAP_GROWTH=1)
    graw=$(((r2 - r1) / N)); gshim=$(((g2 - g1) / N))
    printf 'growth mode (GPUCAP_GROWTH=1), %s blocks: raw %d, gpucap %d, added %d\n' "$size" "$graw" "$gshim" $((gshim - graw))
    growth_json+="${growth_json:+,}{\"size\":\"$size\",\"raw_per_pair\":$graw,\"gpucap_per_pair\":$gshim,\"added_per_pair\":$((gshim - graw))}"
done
printf '{"pairs":%d,"raw_per_pair":%d,"gpucap_per_pair":%d,"added_per_pair":%d,"pool_per_pair":%d,"pool_added_per_pair":%d,"shares_per_pair":%d,"shares_added_per_pair":%d,"two_gpus_added_per_pair":%d,"two_threads_added_per_pair":%d,"launch_raw":%d,"launch_added":%d,"live":[%s],"growth":[%s]}\n' \
    "$N" "$raw" "$shim" $((shim - raw)) "$pool" $((pool - raw)) "$shares" $((shares - raw)) $((g2shim - g2raw)) $((t2shim - t2raw)) \
    "$launch_raw" $((launch_shim - launch_raw)) "$live_json" "$growth_json" >"$JSON"
