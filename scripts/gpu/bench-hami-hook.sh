#!/usr/bin/env bash
# gpu-run.sh's bench-hami hook: scripts/bench/bench-hami.sh on the HAMi-core build carried in
# target/hami (made beforehand with `scripts/bench/bench-hami.sh HAMI_SRC --build-only`: the
# device machine has no network and HAMi-core's source is not in this repository),
# writing DIR/hami.json. Exit 77 (SKIP) when there is no such build.
#
#   scripts/gpu/bench-hami-hook.sh DIR        (HAMI_REPS: rounds, default 3)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:?usage: bench-hami-hook.sh DIR}
so=$ROOT/target/hami/libvgpu.so
if [ ! -f "$so" ]; then
    echo "no HAMi-core build at target/hami/libvgpu.so (build it with scripts/bench/bench-hami.sh HAMI_SRC --build-only and carry target/hami): nothing to compare"
    exit 77
fi
REPS=${HAMI_REPS:-3} exec "$ROOT/scripts/bench/bench-hami.sh" --so "$so" --out "$dir/hami.json"
