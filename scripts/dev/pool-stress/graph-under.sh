#!/usr/bin/env bash
# graph-under.sh RUNS: member 1 raises its stack by 396 MiB and lowers it, 40 times, while
# members 2-3 run graphs with a 256 MiB alloc node and trim the graph memory
# (cuDeviceGraphMemTrim: the driver gives it back; announced to the pool since the
# fifty-third session) under an 8 GiB cap:
# a stack charged below 396 MiB is a stack the pool under-counts while it is raised.
cd "$(dirname "$0")/../../.." || exit 9
P=3 scripts/dev/pool-stress/under.sh "${1:-8}" PS_THREADS=1 PS_MS=3000 PS_MAX=2Mi PS_OPOTHERS=graph PS_OTHERN=300 PS_OTHERSZ=256Mi PS_OTHERGAP=1 PS_OPGAP=20 N=40 "${@:2}"
