#!/usr/bin/env bash
# How long N processes started at once take until every one holds a block, on the fake
# driver (no GPU needed): raw (no shim), gpucap alone (GPUCAP_LIMIT), gpucap in a pool
# (GPUCAP_POOL, a fresh pool file each start) and in a claim's pool (GPUCAP_CLAIM_DIR, a
# fresh directory each start: its words in a memfd handed over by socket), in interleaved
# rounds.
#
#   scripts/bench/bench-start.sh [-n N]... [--rounds R] [--context-delay-ms MS] [--floor] [--no-build]
#
#   -n N                 processes started at once (repeatable; default: 1 64 1000 4096)
#   --rounds R           starts of each way for each N (default 3), interleaved: round r
#                        runs raw, alone, pool, claim (and floor) in an order that turns
#                        with r
#   --context-delay-ms   how long the fake takes to make each context
#                        (FAKECUDA_CONTEXT_DELAY_MS; default 0)
#   --floor              a fifth way: tests/c/start_floor.c preloaded, the least a start
#                        of gpucap's design does (NVML loaded and read, a sealed memfd
#                        and a visible file) and nothing else: what gpucap adds beyond it
#                        is its own
#   --no-build           use the release build as it is
#   --instructions       instead: the instructions of one process's start (cuInit, its
#                        context, 1 MiB allocated and freed, exit) counted by callgrind,
#                        raw, alone and in a fresh pool: deterministic, so the book's
#                        figures are held to this tree (tests/bench/bench_start.rs); JSON in
#                        target/bench-start-instructions.json (BENCH_JSON overrides)
# BENCH_START_SHIM=<path> measures another build of libgpucap.so (say, an older one).
#
# Each start is tests/c/bench_start.c: it forks the N processes, each makes its primary
# context and allocates 1 MiB, and reports when it holds it (a pipe, no polling); the
# start's time is from the first fork to the last block held. Per N and way: the median
# (and min-max) of the rounds' times, the median of each member's own time, the ratio of
# the medians to raw's, and each round's ratio to the raw start of the same round (their
# median and min-max: `round_ratios` in the JSON; the machine's drift between rounds is
# in both sides of each). Prints a table, then one JSON line (also written to
# target/bench-start.json).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

NS=()
ROUNDS=3
DELAY=0
BUILD=1
INSTRUCTIONS=0
FLOOR=0
need() { [ $# -ge 2 ] && [[ $2 =~ ^[0-9]+$ ]] || { echo "gpucap bench-start: $1 needs a whole number (got '${2:-}')" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
    case $1 in
        -n | --members) need "$@"; NS+=("$2"); shift 2 ;;
        --rounds) need "$@"; ROUNDS=$2; shift 2 ;;
        --context-delay-ms) need "$@"; DELAY=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        --floor) FLOOR=1; shift ;;
        --instructions) INSTRUCTIONS=1; shift ;;
        -h | --help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpucap bench-start: unknown argument '$1' (accepted: -n N, --rounds R, --context-delay-ms MS, --floor, --no-build, --instructions)" >&2; exit 2 ;;
    esac
done
[ ${#NS[@]} -gt 0 ] || NS=(1 64 1000 4096)
for n in "${NS[@]}"; do
    if [ "$n" -lt 1 ] || [ "$n" -gt 4096 ]; then
        echo "gpucap bench-start: -n $n: a pool holds 1 to 4096 members" >&2
        exit 2
    fi
done
[ "$ROUNDS" -ge 1 ] || { echo "gpucap bench-start: --rounds must be at least 1" >&2; exit 2; }

if [ "$BUILD" = 1 ]; then
    echo "== building (release)" >&2
    cargo build --release >&2
fi
R=$ROOT/target/release
SHIM=${BENCH_START_SHIM:-$R/libgpucap.so}
for f in "$SHIM" "$R/libcuda.so" "$R/libnvidia_ml.so"; do
    [ -f "$f" ] || { echo "gpucap bench-start: $f missing: run cargo build --release" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "gpucap bench-start: python3 not found" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=scripts/bench/bench-lib.sh
. scripts/bench/bench-lib.sh
bench_clean_env
FAKEDIR=$tmp/fakecuda
mkdir -p "$FAKEDIR"
ln -sf "$R/libcuda.so" "$FAKEDIR/libcuda.so.1"
ln -sf "$R/libcuda.so" "$FAKEDIR/libcuda.so"
# NVML beside it, as every driver ships it: gpucap measures a first context by NVML's
# figures (without it, with a temporary context: one context creation more).
ln -sf "$R/libnvidia_ml.so" "$FAKEDIR/libnvidia-ml.so.1"
BIN=$tmp/bench_start
cc -O2 -Wall -Werror -I tests/c -o "$BIN" tests/c/bench_start.c -L "$FAKEDIR" -lcuda

if [ "$INSTRUCTIONS" = 1 ]; then
    VALGRIND=$(command -v valgrind) || { echo "gpucap bench-start: valgrind not found (apt-get install valgrind)" >&2; exit 1; }
    # Everything the process loads and names at fixed paths of its own: the loader's and
    # the shim's work on paths then does not vary with where the checkout lies.
    bench_fixed_layout bench-start "$SHIM" nvml
    cc -O2 -Wall -Werror -I tests/c -o "$lay/bench_start" tests/c/bench_start.c -L "$lay" -lcuda
    # A network namespace of its own for each counted start (bench-lib.sh's bench_netns).
    bench_netns bench-start
    # counted WAY: the instructions of one start, set-up and exit included.
    counted() {
        local way=$1 out vars=(PATH=/usr/bin:/bin LD_LIBRARY_PATH="$lay" FAKECUDA_TOTAL_MEM=80Gi)
        out=$lay/cg.$way
        rm -rf "$lay/pools"
        mkdir "$lay/pools"
        case $way in
            alone) vars+=(GPUCAP_LIMIT=40Gi LD_PRELOAD="$lay/libgpucap.so") ;;
            pool) vars+=(GPUCAP_LIMIT=40Gi GPUCAP_POOL=bench-start GPUCAP_POOL_DIR="$lay/pools"
                GPUCAP_POOL_MEMBERS=256 LD_PRELOAD="$lay/libgpucap.so") ;;
        esac
        # A fixed environment (env -i): the loader, the fake and the shim each read the
        # environment, at a cost that grows with its size.
        (cd "$lay" && "${NETNS[@]}" env -i "${vars[@]}" "$VALGRIND" --tool=callgrind --callgrind-out-file="$out" \
            ./bench_start once) >"$lay/log.$way" 2>&1 ||
            { echo "gpucap bench-start: $way start failed under callgrind:" >&2; cat "$lay/log.$way" >&2; exit 1; }
        awk '/^summary:/ {print $2}' "$out"
    }
    raw=$(counted raw); alone=$(counted alone); pool=$(counted pool)
    printf "a process's start (cuInit, context, 1 MiB allocated and freed, exit): raw %d instructions, gpucap %d, added %d; in a pool %d, added %d\n" \
        "$raw" "$alone" $((alone - raw)) "$pool" $((pool - raw))
    printf '{"raw":%d,"gpucap":%d,"added":%d,"pool":%d,"pool_added":%d}\n' \
        "$raw" "$alone" $((alone - raw)) "$pool" $((pool - raw)) >"${BENCH_JSON:-$ROOT/target/bench-start-instructions.json}"
    exit 0
fi

FLOOR_LIB=$tmp/libstart_floor.so
# The floor's visible files where gpucap alone puts its own (/dev/shm: a tmpfs; on a disk's
# file system each file made and removed costs its journal more).
FLOOR_DIR=$tmp/floor
if [ "$FLOOR" = 1 ]; then
    cc -O2 -Wall -Werror -shared -fPIC -o "$FLOOR_LIB" tests/c/start_floor.c -ldl
    if [ -d /dev/shm ] && [ -w /dev/shm ]; then
        FLOOR_DIR=$(mktemp -d /dev/shm/gpucap-bench-floor.XXXXXX)
        trap 'rm -rf "$tmp" "$FLOOR_DIR"' EXIT
    fi
fi

# start WAY N: one start of N processes; prints bench_start's line.
start() {
    local way=$1 n=$2 members
    local vars=(LD_LIBRARY_PATH="$FAKEDIR" FAKECUDA_TOTAL_MEM=80Gi FAKECUDA_CONTEXT_DELAY_MS="$DELAY")
    case $way in
        raw) env "${vars[@]}" "$BIN" "$n" ;;
        alone) env "${vars[@]}" GPUCAP_LIMIT=40Gi "$BIN" "$n" "$SHIM" ;;
        pool)
            members=$((n < 256 ? 256 : n))
            rm -rf "$tmp/pools"
            mkdir -p "$tmp/pools"
            env "${vars[@]}" GPUCAP_LIMIT=40Gi GPUCAP_POOL=bench-start GPUCAP_POOL_DIR="$tmp/pools" \
                GPUCAP_POOL_MEMBERS="$members" "$BIN" "$n" "$SHIM"
            ;;
        claim)
            members=$((n < 256 ? 256 : n))
            rm -rf "$tmp/claim"
            mkdir -p "$tmp/claim"
            chmod 0777 "$tmp/claim"
            env "${vars[@]}" GPUCAP_LIMIT=40Gi GPUCAP_CLAIM_DIR="$tmp/claim" \
                GPUCAP_POOL_MEMBERS="$members" "$BIN" "$n" "$SHIM"
            ;;
        floor)
            rm -rf "$FLOOR_DIR"
            mkdir -p "$FLOOR_DIR"
            env "${vars[@]}" BENCH_FLOOR_DIR="$FLOOR_DIR" "$BIN" "$n" "$FLOOR_LIB"
            ;;
    esac
}

ways=(raw alone pool claim)
[ "$FLOOR" = 0 ] || ways+=(floor)
lines=$tmp/lines
: >"$lines"
for n in "${NS[@]}"; do
    for ((r = 0; r < ROUNDS; r++)); do
        for ((k = 0; k < ${#ways[@]}; k++)); do
            way=${ways[$(((k + r) % ${#ways[@]}))]}
            out=$(start "$way" "$n") || { echo "gpucap bench-start: $way start of $n failed: $out" >&2; exit 1; }
            echo "n=$n round=$r $way: $out" >&2
            echo "way=$way round=$r $out" >>"$lines"
        done
    done
done

python3 - "$lines" "$DELAY" "$ROUNDS" "$ROOT/target/bench-start.json" <<'EOF'
import json, statistics, sys

lines, delay, rounds, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
runs = {}
for line in open(lines):
    f = dict(kv.split("=", 1) for kv in line.split())
    runs.setdefault((int(f["n"]), f["way"]), []).append(f)
results = []
print(f"{'N':>5} {'way':6} {'all hold (median, min-max)':>28} {'per member':>11} {'x raw':>6}"
      f" {'x raw a round (median, min-max)':>32}")
for n in sorted({n for n, _ in runs}):
    raw = statistics.median(float(f["all_ms"]) for f in runs[(n, "raw")])
    raw_of = {f["round"]: float(f["all_ms"]) for f in runs[(n, "raw")]}
    for way in ("raw", "alone", "pool", "claim", "floor"):
        if (n, way) not in runs:
            continue
        fs = runs[(n, way)]
        alls = sorted(float(f["all_ms"]) for f in fs)
        med = statistics.median(alls)
        member = statistics.median(float(f["median_ms"]) for f in fs)
        ratio = med / raw if raw > 0 else None
        # Each round's start against the raw start of the same round: the machine's
        # drift between rounds (another tenant, the page cache) is in both.
        by_round = sorted(
            float(f["all_ms"]) / raw_of[f["round"]] for f in fs if raw_of.get(f["round"], 0) > 0
        )
        results.append({
            "n": n, "way": way, "all_ms": alls, "all_ms_median": med,
            "member_ms_median": member,
            "member_ms_p90": statistics.median(float(f["p90_ms"]) for f in fs),
            "ratio_to_raw": round(ratio, 3) if ratio else None,
            "round_ratios": [round(x, 3) for x in by_round],
        })
        spread = f"{med / 1e3:7.2f} s ({alls[0] / 1e3:.2f}-{alls[-1] / 1e3:.2f})"
        rounds_text = (
            f"{statistics.median(by_round):.2f} ({by_round[0]:.2f}-{by_round[-1]:.2f})"
            if by_round else "-"
        )
        print(f"{n:>5} {way:6} {spread:>28} {member:8.1f} ms {ratio:6.2f} {rounds_text:>32}")
doc = {"bench": "start", "context_delay_ms": delay, "rounds": rounds, "results": results}
open(path, "w").write(json.dumps(doc) + "\n")
print(json.dumps(doc))
EOF
