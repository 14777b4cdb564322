#!/usr/bin/env bash
# Builds libgpucap.so and the gpucap command for a C library older than this machine's,
# so that they load in any image with glibc 2.27 or later (Ubuntu 18.04 on, Debian 10 on,
# RHEL, Rocky and Alma 8 on): what the CDI device and the Kubernetes installs mount into
# images they do not choose. A build on this machine asks for the glibc it was built
# against (Debian 12: symbols up to GLIBC_2.35), and an older image's loader refuses it.
#
#   scripts/build-portable.sh [--glibc X.Y] [--out DIR] [--with-fake]
#
# --glibc      the oldest glibc to load in (default 2.27; Rust's std needs 2.25 for the
#              command, getrandom)
# --out        where the files go (default target/portable)
# --with-fake  the fake GPU too (libcuda.so.1, libnvidia-ml.so.1), tests/c/script.c built
#              against them (`script`) and tests/c/exec_edges.c: what
#              tests/deployment/containers/old_glibc.rs runs in an image with an older glibc
#
# Links with zig through cargo-zigbuild (both from PyPI, pinned, in target/venv-zig:
# downloaded the first time), against zig's copy of that glibc's symbol list; builds in
# target/<host>/release. Checks that no symbol of either file asks for a newer glibc, and
# prints the newest version each asks for. Costs more at each process start than the
# native build (docs/src/performance.md, "Starting many processes": the loader binds
# libdl and libpthread besides the C library).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

GLIBC=2.27
OUT=target/portable
FAKE=false
while [ $# -gt 0 ]; do
    case $1 in
        --glibc) GLIBC=${2:?--glibc needs a version, such as 2.27}; shift 2 ;;
        --out) OUT=${2:?--out needs a directory}; shift 2 ;;
        --with-fake) FAKE=true; shift ;;
        *) echo "build-portable.sh: unknown argument '$1' (accepted: --glibc X.Y, --out DIR, --with-fake)" >&2; exit 2 ;;
    esac
done
[[ $GLIBC =~ ^2\.[0-9]+$ ]] || { echo "build-portable.sh: --glibc $GLIBC: a version such as 2.27" >&2; exit 2; }

VENV=target/venv-zig
pins=(ziglang==0.17.1 cargo-zigbuild==0.24.1)
scripts/dev/pinned-venv.sh "$VENV" pass "${pins[@]}" >&2
export PATH=$PWD/$VENV/bin:$PATH

host=$(rustc -vV | sed -n 's/^host: //p')
case $host in
    *-linux-gnu) ;;
    *) echo "build-portable.sh: builds for a glibc target, and this machine's Rust is for $host" >&2; exit 1 ;;
esac
packages=(-p gpucap-shim -p gpucap)
files=(libgpucap.so gpucap)
$FAKE && packages+=(-p cuda-stubs -p fake-nvml)
cargo zigbuild --release --target "$host.$GLIBC" "${packages[@]}" >&2
built=${CARGO_TARGET_DIR:-target}/$host/release

mkdir -p "$OUT"
for f in "${files[@]}"; do
    install -m 755 "$built/$f" "$OUT/$f"
done
if $FAKE; then
    install -m 755 "$built/libcuda.so" "$OUT/libcuda.so.1"
    install -m 755 "$built/libnvidia_ml.so" "$OUT/libnvidia-ml.so.1"
    ln -sf libcuda.so.1 "$OUT/libcuda.so"
    python-zig cc -target "${host%%-*}-linux-gnu.$GLIBC" -O2 -o "$OUT/script" tests/c/script.c \
        -I tests/c -L "$OUT" -lcuda -ldl
    python-zig cc -target "${host%%-*}-linux-gnu.$GLIBC" -O2 -pthread -o "$OUT/exec_edges" \
        tests/c/exec_edges.c -ldl
    files+=(libcuda.so.1 libnvidia-ml.so.1 script exec_edges)
fi
for f in "${files[@]}"; do
    symbols=$(objdump -T "$OUT/$f") || { echo "build-portable.sh: objdump -T $OUT/$f failed" >&2; exit 1; }
    newest=$(grep -oE 'GLIBC_2\.[0-9]+' <<<"$symbols" | sort -V | tail -1 || true)
    if [ -z "$newest" ]; then
        echo "$OUT/$f: no versioned glibc symbol"
        continue
    fi
    if [ "$(printf '%s\n' "${newest#GLIBC_}" "$GLIBC" | sort -V | tail -1)" != "$GLIBC" ]; then
        echo "build-portable.sh: $OUT/$f asks for $newest, newer than glibc $GLIBC" >&2
        exit 1
    fi
    echo "$OUT/$f: glibc $GLIBC or later (its newest symbol: $newest)"
done
