#!/usr/bin/env bash
# Where the shim's instructions per cuMemAlloc_v2 + cuMemFree_v2 pair go, by source file:
# callgrind on the fake driver (as scripts/bench/bench-instructions.sh), N vs 2N pairs of 4 KiB,
# every instruction of libgpucap.so counted at its address (--dump-instr=yes), the
# difference / N attributed to the innermost source file of gpucap's own that the
# instruction was inlined from (addr2line -i; the release build keeps debug lines).
#
#   scripts/bench/bench-breakdown.sh [N]        # N pairs (default 2000), then 2N
#
# Two ways: alone (GPUCAP_LIMIT) and in a pool (GPUCAP_POOL). Prints, per way, the
# instructions per pair in libgpucap.so and their share by file, with what each file
# does on this path. Needs valgrind, addr2line (binutils), python3 and a release build.
# Read beside scripts/bench/bench-instructions.sh, whose totals also count what the shim's
# calls cost outside its own code (the C library's, the loader's): a few per pair.
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${1:-2000}
[ $# -le 1 ] || { echo "bench-breakdown: one argument at most, N (got $#)" >&2; exit 2; }
[[ $N =~ ^[1-9][0-9]{0,6}$ ]] || { echo "bench-breakdown: N must be a whole number of pairs, 1 to 9999999 (got '$N')" >&2; exit 2; }
R=$PWD/target/release
SHIM=$R/libgpucap.so
. scripts/bench/bench-lib.sh
bench_prepare bench-breakdown "$SHIM" valgrind addr2line python3

# run OUT PAIRS [VAR=VALUE...]: one callgrind run with per-instruction counts.
run() {
    local out=$1 pairs=$2
    shift 2
    env LD_LIBRARY_PATH="$FAKEDIR" FAKECUDA_TOTAL_MEM=80Gi GPUCAP_LIMIT=40Gi "$@" LD_PRELOAD="$SHIM" \
        valgrind --tool=callgrind --dump-instr=yes --callgrind-out-file="$out" \
        "$BIN" 1 "$pairs" 4Ki pair live=0 >/dev/null 2>"$out.log" ||
        { echo "bench-breakdown: bench_alloc $pairs pairs failed under valgrind:" >&2; tail -20 "$out.log" >&2; exit 1; }
}
run "$tmp/alone.1" "$N"
run "$tmp/alone.2" $((2 * N))
run "$tmp/pool.1" "$N" GPUCAP_POOL=breakdown GPUCAP_POOL_DIR="$tmp"
run "$tmp/pool.2" $((2 * N)) GPUCAP_POOL=breakdown GPUCAP_POOL_DIR="$tmp"

python3 - "$SHIM" "$N" "$tmp" <<'EOF'
import collections, re, subprocess, sys

so, n, tmp = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ROLE = {
    "shim/table.rs": "hook entry and exit: frames, the driver's address",
    "shim/hooks/mod.rs": "short-path checks, device, driver call, free's dispatch",
    "shim/hooks/memory.rs": "cuMemAlloc/cuMemFree hooks",
    "core/linear.rs": "size rounded to the driver's granularity",
    "shim/driver/forward.rs": "the forwarding call into the driver's function",
    "shim/driver/types.rs": "typed pointer arguments: null checks, reads and writes",
    "shim/driver/hooked.rs": "the hooked signatures' generated calls",
    "core/ledger/mod.rs": "the process's ledger: reservation, credit; the pool's member",
    "core/ledger/device.rs": "the process's ledger: cap check and add, peak",
    "core/ledger/reservation.rs": "the process's ledger: a reservation's commit and roll-back",
    "core/live_map/mod.rs": "live-allocation map: insert and remove",
    "core/live_map/table.rs": "live-allocation map: buckets",
    "core/live_map/entry.rs": "live-allocation map: hash, packed charges",
    "core/live_map/front.rs": "live-allocation map: the front's one slot",
    "core/counter.rs": "the count of allocations, spread over eight cache lines",
    "core/budget/used.rs": "pool: the shared used word, own use, pending bracket, peaks",
    "core/budget/short_path.rs": "pool: the short path's route and one-try rule, the started mark",
    "core/budget/account.rs": "pool: the whole reservation rule",
    "core/budget/marks.rs": "pool: traffic marks (started/made, freeing/freed), credit",
    "core/budget/layout.rs": "pool: the shared file's words",
    "core/budget/gpu_words.rs": "pool: the member's words",
    "core/budget/wait.rs": "pool: waiters",
}

def counts(path):
    """Instructions per address of libgpucap.so in one callgrind output."""
    c = collections.Counter()
    objs, obj, ours, last, skip = {}, None, False, 0, False
    for line in open(path):
        m = re.match(r"(c?ob)=\((\d+)\)(?: (.*))?", line)
        if m:
            if m.group(3):
                objs[m.group(2)] = m.group(3).strip()
            if m.group(1) == "ob":
                obj = objs[m.group(2)]
            continue
        if line.startswith("fn="):
            ours, skip = "libgpucap" in (obj or ""), False
            continue
        if line.startswith("calls="):
            skip = True  # the next line is the call's inclusive cost
            continue
        m = re.match(r"(0x[0-9a-f]+|[+-]\d+|\*)\s+(\S+)\s+(\d+)", line)
        if not m:
            continue
        a = m.group(1)
        last = int(a, 16) if a.startswith("0x") else last + int(a) if a[0] in "+-" else last
        if skip:
            skip = False
            continue
        if ours:
            c[last] += int(m.group(3))
    return c

def source_file(addrs):
    out = subprocess.run(["addr2line", "-a", "-i", "-e", so] + [hex(a) for a in addrs],
                         capture_output=True, text=True, check=True).stdout
    chains, cur = {}, None
    for line in out.splitlines():
        if line.startswith("0x"):
            cur = int(line, 16)
            chains[cur] = []
        else:
            chains[cur].append(line)
    files = {}
    for a, chain in chains.items():
        own = [l for l in chain if "/src/" in l and "/rustc/" not in l and "/library/" not in l]
        # A location without a line ("file:?") is code the compiler merged from several
        # places (a shared return value, say): the caller that has a line says more.
        placed = [l for l in own if not l.endswith(":?")] or own
        files[a] = placed[0].split("/src/", 1)[1].split(":")[0] if placed else "(outside gpucap's sources)"
    return files

for way in ("alone", "pool"):
    one, two = counts(f"{tmp}/{way}.1"), counts(f"{tmp}/{way}.2")
    per = {a: (two[a] - one.get(a, 0)) / n for a in two if two[a] > one.get(a, 0)}
    files = source_file(sorted(per))
    by = collections.Counter()
    for a, v in per.items():
        by[files[a]] += v
    total = sum(by.values())
    print(f"{way}: {total:.0f} instructions per pair in libgpucap.so (N={n})")
    for f, v in by.most_common():
        if v >= 0.5:
            print(f"  {v:6.0f}  {100 * v / total:3.0f} %  {f:26s} {ROLE.get(f, '')}")
EOF
