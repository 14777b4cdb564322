#!/usr/bin/env bash
# gpucap's fake GPU for your own program, on a machine without an NVIDIA GPU.
#
#   scripts/fake-gpu.sh                 prints the folder to put first on LD_LIBRARY_PATH
#   scripts/fake-gpu.sh [--] CMD ARGS   runs CMD with that folder first on LD_LIBRARY_PATH
#
# The folder (target/release/fake-gpu) holds libcuda.so.1 and libcuda.so, links to the
# fake CUDA driver (cuda-stubs), and libnvidia-ml.so.1 and libnvidia-ml.so, links to
# the fake NVML (cuda-stubs/nvml): a program that loads the driver or NVML by those
# names (dlopen, or linked with -lcuda / -lnvidia-ml) gets the fakes. Build them first
# with `cargo build --release` at the repository root. The fake GPU's size, count and
# more are FAKECUDA_* variables (cuda-stubs/README.md), e.g. FAKECUDA_TOTAL_MEM=16Gi.
#
#   cargo build --release
#   scripts/fake-gpu.sh target/release/gpucap run --limit 1Gi -- ./my_cuda_app
#   export LD_LIBRARY_PATH=$(scripts/fake-gpu.sh)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=$ROOT/target/release
DIR=$BIN/fake-gpu

case "${1-}" in
-h | --help)
    sed -n '2,16s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"
    exit 0
    ;;
--) shift ;;
-*)
    echo "scripts/fake-gpu.sh: unknown option '$1'; accepted: -h, --help, or [--] CMD ARGS..." >&2
    exit 2
    ;;
esac

missing=()
for lib in libcuda.so libnvidia_ml.so; do
    [ -f "$BIN/$lib" ] || missing+=("$BIN/$lib")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "scripts/fake-gpu.sh: the fake GPU is not built (no ${missing[*]}): run 'cargo build --release' in $ROOT first" >&2
    exit 1
fi

# Each link is made beside its final name and renamed over it: a program that loads
# the folder meanwhile never finds a name missing.
mkdir -p "$DIR"
link() {
    local target=$1 name=$2
    if [ "$(readlink "$DIR/$name" 2>/dev/null)" != "$target" ]; then
        ln -sfn "$target" "$DIR/.$name.$$"
        mv -fT "$DIR/.$name.$$" "$DIR/$name"
    fi
}
link "$BIN/libcuda.so" libcuda.so.1
link "$BIN/libcuda.so" libcuda.so
link "$BIN/libnvidia_ml.so" libnvidia-ml.so.1
link "$BIN/libnvidia_ml.so" libnvidia-ml.so

if [ $# -eq 0 ]; then
    printf '%s\n' "$DIR"
    exit 0
fi
export LD_LIBRARY_PATH="$DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$@"
