#!/usr/bin/env bash
# How soon a member waiting for memory (GPUCAP_WAIT) is served once an operator makes
# room, on the fake driver (no GPU needed): a live pool's cap raised with
# `gpucap pool resize`, and a member's own ceiling raised with `gpucap pool set`.
#
#   scripts/bench/bench-raise.sh [--rounds R] [--no-build]
#
#   --rounds R    raises of each kind (default 10)
#   --no-build    use the release build as it is
#
# Each round, in a fresh pool `t` of 1 GiB on a fresh fake GPU:
#   resize   member a holds 900 MiB; member b (GPUCAP_WAIT=60s) asks for 300 MiB and
#            waits; `gpucap pool resize t 2Gi`.
#   ceiling  member c (GPUCAP_CEILING=300Mi, GPUCAP_WAIT=60s) holds 300 MiB and asks for
#            100 MiB more: it waits at its own ceiling; `gpucap pool set t PID
#            --ceiling 600Mi`.
# Timed from the command's start to the waiter's line saying its allocation returned
# (tests/c/script.c, line-buffered, read as it comes), beside the command's own time
# (start to exit: most of it is starting the CLI). A waiter that only looked again on
# its own would be served up to its retry period after the command; one woken by the
# change is served within the command's time.
# Prints a table (median, min-max, ms) and one JSON line (also target/bench-raise.json;
# BENCH_RAISE_JSON overrides).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

ROUNDS=10
BUILD=1
while [ $# -gt 0 ]; do
    case $1 in
        --rounds)
            [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "gpucap bench-raise: --rounds needs a whole number from 1 (got '${2:-}')" >&2; exit 2; }
            ROUNDS=$2; shift 2 ;;
        --no-build) BUILD=0; shift ;;
        -h | --help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpucap bench-raise: unknown argument '$1' (accepted: --rounds R, --no-build)" >&2; exit 2 ;;
    esac
done

if [ "$BUILD" = 1 ]; then
    echo "== building (release)" >&2
    cargo build --release >&2
fi
R=$ROOT/target/release
for f in "$R/gpucap" "$R/libgpucap.so" "$R/libcuda.so"; do
    [ -f "$f" ] || { echo "gpucap bench-raise: $f missing: run cargo build --release" >&2; exit 1; }
done
command -v python3 >/dev/null || { echo "gpucap bench-raise: python3 not found" >&2; exit 1; }
command -v cc >/dev/null || { echo "gpucap bench-raise: cc not found (apt-get install gcc)" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shellcheck source=scripts/bench/bench-lib.sh
. scripts/bench/bench-lib.sh
bench_clean_env
mkdir -p "$tmp/fakecuda"
ln -sf "$R/libcuda.so" "$tmp/fakecuda/libcuda.so.1"
ln -sf "$R/libcuda.so" "$tmp/fakecuda/libcuda.so"
SCRIPT=$tmp/script
cc -O2 -Wall -Werror -I tests/c -o "$SCRIPT" tests/c/script.c -L "$tmp/fakecuda" -lcuda

python3 - "$R/gpucap" "$SCRIPT" "$tmp" "$ROUNDS" "${BENCH_RAISE_JSON:-$ROOT/target/bench-raise.json}" <<'EOF'
import json, os, shutil, statistics, subprocess, sys, threading, time

gpucap, script, tmp, rounds, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
MIB = 1 << 20


def env_of(d, extra):
    e = dict(os.environ)
    e.update({
        "LD_LIBRARY_PATH": os.path.join(tmp, "fakecuda"),
        "FAKECUDA_TOTAL_MEM": "16Gi",
        "FAKECUDA_SHARED": os.path.join(d, "fake-gpu"),
        "GPUCAP_POOL_DIR": d,
    })
    e.update(extra)
    return e


def member(d, name, extra, steps):
    """A member of pool t (1 GiB) running `steps`, then holding its memory; its stderr
    goes to NAME.err."""
    argv = [gpucap, "run", "--limit", "1Gi", "--pool", "t", "--", script, *steps,
            f"touch:{d}/{name}.done", f"wait:{d}/never"]
    err = open(f"{d}/{name}.err", "w")
    return subprocess.Popen(argv, env=env_of(d, extra), stdout=subprocess.PIPE,
                            stderr=err, text=True)


def said(d, name, text):
    try:
        return text in open(f"{d}/{name}.err").read()
    except OSError:
        return False


def until(what, check, limit=30.0):
    end = time.monotonic() + limit
    while not check():
        if time.monotonic() > end:
            sys.exit(f"gpucap bench-raise: {what} did not happen within {limit} s")
        time.sleep(0.002)


def line_watch(p, want):
    """The time the waiter's line `want` is read (a thread reading its stdout)."""
    seen = {}

    def read():
        for line in p.stdout:
            if line.strip() == want and "t" not in seen:
                seen["t"] = time.monotonic()
    th = threading.Thread(target=read, daemon=True)
    th.start()
    return seen


def one(kind, r):
    d = os.path.join(tmp, f"{kind}-{r}")
    os.makedirs(d)
    procs = []
    try:
        if kind == "resize":
            a = member(d, "a", {"GPUCAP_WAIT": "0"}, ["alloc:900Mi"])
            procs.append(a)
            until("member a's 900 MiB", lambda: os.path.exists(f"{d}/a.done"))
            name, waiting = "b", "gpucap: waiting for 300 MiB on GPU 0"
            w = member(d, name, {"GPUCAP_WAIT": "60s"}, ["alloc:300Mi"])
            want = f"alloc {300 * MIB} 0"
            cmd = [gpucap, "pool", "resize", "t", "2Gi"]
        else:
            name, waiting = "c", "past this process's 300 MiB ceiling"
            w = member(d, name, {"GPUCAP_WAIT": "60s", "GPUCAP_CEILING": "300Mi"},
                       ["alloc:300Mi", "alloc:100Mi"])
            want = f"alloc {100 * MIB} 0"
            # `gpucap run` executes the program: the member's pid is the child's.
            cmd = [gpucap, "pool", "set", "t", str(w.pid), "--ceiling", "600Mi"]
        procs.append(w)
        seen = line_watch(w, want)
        until("the waiter's wait", lambda: said(d, name, waiting) or w.poll() is not None)
        if w.poll() is not None:
            sys.exit(f"gpucap bench-raise: the {kind} waiter ended instead of waiting")
        t0 = time.monotonic()
        c = subprocess.run(cmd, env=env_of(d, {}), capture_output=True, text=True)
        t1 = time.monotonic()
        if c.returncode != 0:
            sys.exit(f"gpucap bench-raise: {' '.join(cmd[1:])} failed: {c.stderr.strip()}")
        until("the waiter's allocation", lambda: "t" in seen)
        return (seen["t"] - t0) * 1e3, (t1 - t0) * 1e3
    finally:
        for p in procs:
            p.kill()
            p.wait()
        shutil.rmtree(d, ignore_errors=True)


runs = {"resize": [], "ceiling": []}
for r in range(rounds):
    for kind in (("resize", "ceiling") if r % 2 == 0 else ("ceiling", "resize")):
        served, command = one(kind, r)
        runs[kind].append({"served_ms": served, "command_ms": command})
        print(f"round {r} {kind}: served {served:.1f} ms after the command started "
              f"(the command: {command:.1f} ms)", file=sys.stderr)

results = []
print(f"{'raise':8} {'served after (median, min-max)':>32} {'the command':>24}")
for kind, rs in runs.items():
    s = sorted(x["served_ms"] for x in rs)
    c = sorted(x["command_ms"] for x in rs)
    results.append({"kind": kind, "served_ms": s, "served_ms_median": statistics.median(s),
                    "command_ms": c, "command_ms_median": statistics.median(c)})
    print(f"{kind:8} {statistics.median(s):14.1f} ms ({s[0]:.1f}-{s[-1]:.1f}) "
          f"{statistics.median(c):9.1f} ms ({c[0]:.1f}-{c[-1]:.1f})")
doc = {"bench": "raise", "rounds": rounds, "results": results}
open(out, "w").write(json.dumps(doc) + "\n")
print(json.dumps(doc))
EOF
