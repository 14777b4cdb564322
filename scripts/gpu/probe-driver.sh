#!/usr/bin/env bash
# The driver's answers, recorded: runs tests/c/driver_probe.c against the libcuda.so.1
# the loader finds (a real driver on a GPU machine; the fake on LD_LIBRARY_PATH in CI)
# and writes OUTDIR/driver-answers.json. Before that, each client present (PyTorch,
# JAX, CuPy, cuda-bindings) runs a small allocation under the shim with GPUCAP_LOG=debug;
# the cuGetProcAddress / cuGetExportTable requests it made ("gpucap: driver request:"
# lines) are asked of the driver by the probe and recorded with the clients that asked.
#
#   scripts/gpu/probe-driver.sh OUTDIR
#
# Environment: PROBE_SHIM (default GPUCAP_LIB, else target/release/libgpucap.so), PROBE_PYTHON (default
# python3), PROBE_CLIENTS (default "torch jax cupy cuda.bindings"), PROBE_TIMEOUT
# (seconds per client, default 120; less under gpu-run.sh's GPU_RUN_DEADLINE). A client whose module does not import is skipped
# (said in OUTDIR/driver-probe.log). Needs cc. Exit status: 0 when the probe's JSON was
# written and every group of the probe finished (none crashed), 1 otherwise.
#
# On a GPU: commit the JSON as tests/driver-answers/<gpu>-<driver>.json (machine.gpu and
# machine.nvml.driver_version name them); tests/real_clients/driver_answers.rs then compares the fake
# with it in CI, and each difference is fixed in the fake or listed in the file's
# "accepted" with why.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
cd "$(dirname "$0")/../.."
OUT=$1
mkdir -p "$OUT"
SHIM=${PROBE_SHIM:-${GPUCAP_LIB:-$PWD/target/release/libgpucap.so}}
PY=${PROBE_PYTHON:-python3}
CLIENTS=${PROBE_CLIENTS-torch jax cupy cuda.bindings}
TIMEOUT=${PROBE_TIMEOUT:-120}
# Under scripts/gpu-run.sh (GPU_RUN_DEADLINE, seconds since the epoch): each client gets
# an equal share of what is left after the driver probe's ~15 s, at least 10 s.
if [ -n "${GPU_RUN_DEADLINE:-}" ]; then
    n=$(wc -w <<<"$CLIENTS")
    share=$(((GPU_RUN_DEADLINE - $(date +%s) - 15) / (n > 0 ? n : 1)))
    [ "$share" -lt 10 ] && share=10
    [ "$share" -lt "$TIMEOUT" ] && TIMEOUT=$share
fi
LOG=$OUT/driver-probe.log
: >"$LOG"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
say() { echo "probe-driver: $*" | tee -a "$LOG" >&2; }

. scripts/bench/bench-lib.sh
driver=$(cuda_link_dir "$tmp/lib") || { say "no libcuda.so.1 found (LD_LIBRARY_PATH, ldconfig)"; exit 1; }
say "driver library: $driver"
cc -O1 -g -Wall -pthread -I tests/c -o "$tmp/driver_probe" tests/c/driver_probe.c -L "$tmp/lib" -lcuda -ldl

# Each client's requests, under the shim.
snippet() {
    case $1 in
        torch) echo 'import torch; x = torch.ones(1 << 20, device="cuda"); print(float(x.sum()))' ;;
        jax) echo 'import jax.numpy as jnp; print(float(jnp.ones(1 << 20).sum()))' ;;
        cupy) echo 'import cupy; print(float(cupy.ones(1 << 20).sum()))' ;;
        cuda.bindings) echo 'from cuda.bindings import driver as d
err, = d.cuInit(0); assert err == d.CUresult.CUDA_SUCCESS, err
err, ctx = d.cuDevicePrimaryCtxRetain(0); d.cuCtxSetCurrent(ctx)
err, p = d.cuMemAlloc(1 << 20); assert err == d.CUresult.CUDA_SUCCESS, err
d.cuMemFree(p); print("ok")' ;;
        *) return 1 ;;
    esac
}
: >"$tmp/asked"
if [ -f "$SHIM" ]; then
    for c in $CLIENTS; do
        code=$(snippet "$c") || { say "$c: unknown client (torch, jax, cupy, cuda.bindings)"; exit 2; }
        if ! "$PY" -c "import $c" >/dev/null 2>&1; then
            say "$c: SKIP (not importable by $PY)"
            continue
        fi
        rc=0
        env LD_PRELOAD="$SHIM" GPUCAP_LOG=debug XLA_PYTHON_CLIENT_PREALLOCATE=false \
            timeout "$TIMEOUT" "$PY" -c "$code" >"$tmp/$c.out" 2>"$tmp/$c.err" || rc=$?
        sed -n 's/^gpucap: driver request: \(.*\) -> -\{0,1\}[0-9]*$/\1/p' "$tmp/$c.err" | sort -u |
            sed "s/\$/ $c/" >>"$tmp/asked"
        say "$c: exit $rc, $(grep -c "$c\$" "$tmp/asked" || true) distinct requests"
        [ "$rc" = 0 ] || tail -5 "$tmp/$c.err" | sed "s/^/  $c: /" | tee -a "$LOG" >&2
    done
else
    say "no shim at $SHIM: the clients' requests are not collected"
fi
# One line per request, with every client that made it.
awk '{ c = $NF; $NF = ""; sub(/ $/, ""); by[$0] = by[$0] " " c } END { for (r in by) print r by[r] }' \
    "$tmp/asked" | sort >"$tmp/requests"
say "$(wc -l <"$tmp/requests") distinct requests to ask the driver"

"$tmp/driver_probe" "$tmp/requests" >"$OUT/driver-answers.json" 2>>"$LOG"
python3 - "$OUT/driver-answers.json" <<'EOF' >>"$LOG" 2>&1 || { tail -3 "$LOG" >&2; say "the probe's output is incomplete (see $LOG)"; exit 1; }
import json, sys
d = json.load(open(sys.argv[1]))
m, a = d["machine"], d["answers"]
crashed = {k: v for k, v in a.items() if k.endswith(".crashed")}
print("probe-driver: %s, driver %s (%s), %d answers, %d requests" % (
    m.get("gpu"), m.get("nvml.driver_version", "?"), m.get("driver_version"), len(a), len(d["requests"])))
for k, v in crashed.items():
    print("probe-driver: group %s: %s" % (k, v))
sys.exit(1 if crashed else 0)
EOF
tail -1 "$LOG" >&2
say "wrote $OUT/driver-answers.json"
