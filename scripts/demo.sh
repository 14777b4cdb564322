#!/usr/bin/env bash
# gpucap demo: build, then run an ordinary CUDA program (tests/cudarc-client, written
# with cudarc and knowing nothing about gpucap) under `gpucap run --limit 1Gi`.
#
#   scripts/demo.sh
#
# With an NVIDIA GPU and driver it runs on the real GPU; otherwise on gpucap's fake
# GPU (cuda-stubs: a libcuda.so.1 backed by host memory, 16 GiB by default here).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BIN=$ROOT/target/release
CLIENT=$BIN/cudarc-client
GPUCAP=$BIN/gpucap

say() { printf '\n==> %s\n' "$*"; }
# Indent a program's output and spell out byte counts in MiB.
show() {
    awk '{
        line = $0
        if ($1 == "mem_get_info") {
            split($2, f, "="); split($3, t, "=")
            line = line sprintf("   (%.0f MiB free of %.0f MiB)", f[2] / 1048576, t[2] / 1048576)
        } else if ($1 == "device") {
            split($3, t, "=")
            line = line sprintf("   (%.0f MiB)", t[2] / 1048576)
        }
        print "    | " line
    }'
}

say "Building gpucap, the fake CUDA driver and the demo program (cargo build --release --workspace)"
cargo build --release --workspace

# Which GPU: a real one if an NVIDIA driver that is not our fake answers.
on_real_gpu=no
real_lib=$(ldconfig -p 2>/dev/null | awk '$1 == "libcuda.so.1" { print $NF; exit }')
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    on_real_gpu=yes
elif [ -n "$real_lib" ] && [ "$(readlink -f "$real_lib")" != "$(readlink -f "$BIN/libcuda.so")" ] \
    && "$CLIENT" >/dev/null 2>&1; then
    on_real_gpu=yes
fi

if [ "$on_real_gpu" = yes ]; then
    say "An NVIDIA driver is present: the demo runs on the real GPU"
    command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L | sed 's/^/    /' || true
else
    say "No NVIDIA GPU here: the demo runs on gpucap's fake GPU (16 GiB, backed by host memory)"
    # The folder with the fake libcuda.so.1 and libnvidia-ml.so.1 (README: "Without a GPU").
    fake_dir=$("$ROOT/scripts/fake-gpu.sh")
    export LD_LIBRARY_PATH="$fake_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export FAKECUDA_TOTAL_MEM=16Gi
fi
# The demo sets the limit itself and needs gpucap's messages.
unset GPUCAP_LIMIT GPUCAP_LOG

STEPS=(256 256 600 256)
say "The program (tests/cudarc-client) asks the driver how much memory there is, then"
echo "    allocates 256, 256, 600 and 256 MiB in turn, keeping each, writing a pattern"
echo "    into it and reading it back (lines 'alloc <MiB> ok' or 'alloc <MiB> err <CUDA error>')."

say "Without gpucap: every allocation succeeds"
"$CLIENT" "${STEPS[@]}" 2>&1 | show

say "What gpucap will enforce (gpucap check --limit 1Gi)"
"$GPUCAP" check --limit 1Gi 2>&1 | sed 's/^/    | /'

say "With gpucap: gpucap run --limit 1Gi -- cudarc-client ${STEPS[*]}"
echo "    The program now sees a 1 GiB GPU; 256 + 256 MiB fit, the 600 MiB allocation"
echo "    would pass 1 GiB and is refused with CUDA_ERROR_OUT_OF_MEMORY, and the last"
echo "    256 MiB still fits (768 MiB in use)."
if [ "$on_real_gpu" = yes ]; then
    echo "    (On a real GPU the memory the CUDA context itself takes may count too, so"
    echo "    the figures in use can be higher and the last 256 MiB may not fit.)"
fi
out=$("$GPUCAP" run --limit 1Gi -- "$CLIENT" "${STEPS[@]}" 2>&1) || {
    printf '%s\n' "$out" | show
    say "FAILED: the capped program did not run to its end"
    exit 1
}
printf '%s\n' "$out" | show

has() { printf '%s\n' "$out" | grep -Eq "$1"; }
if [ "$on_real_gpu" = yes ]; then
    in_use='[0-9.]+ [KMGT]?i?B'
    expected_oks=1
else
    in_use='512 MiB'
    expected_oks=3
fi
if has '^alloc 600 err CUDA_ERROR_OUT_OF_MEMORY$' &&
    has "^gpucap: refused cuMemAlloc[A-Za-z]* of 600 MiB on GPU 0: $in_use of the 1 GiB cap in use\$" &&
    [ "$(printf '%s\n' "$out" | grep -c '^alloc 256 ok$')" -ge "$expected_oks" ]; then
    say "Done: the program was held to 1 GiB; the line starting with 'gpucap: refused' is gpucap's."
    if [ "$on_real_gpu" != yes ]; then
        echo "    Your own program on the fake GPU (README.md, \"Without a GPU\"):"
        echo "    scripts/fake-gpu.sh target/release/gpucap run --limit 1Gi -- ./your_program"
    fi
else
    say "FAILED: the output above is not what a 1 GiB cap should give"
    exit 1
fi
