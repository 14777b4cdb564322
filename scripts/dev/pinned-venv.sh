#!/usr/bin/env bash
# A Python virtual environment holding exactly the pinned packages, made where it is
# missing or holds other versions, reused where it already holds them:
#
#   scripts/dev/pinned-venv.sh DIR IMPORTS NAME==VERSION...
#
# IMPORTS: Python import statements that must work in it ("pass" for none). Prints
# "reusing DIR" or "creating DIR with ...", then "DIR: NAME==VERSION ..."; fails (status 1)
# where the venv cannot be made or does not hold them afterwards. Used by scripts/test.sh,
# scripts/build-wheel.sh and scripts/build-portable.sh.
set -euo pipefail
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
[ $# -ge 3 ] || { echo "usage: scripts/dev/pinned-venv.sh DIR IMPORTS NAME==VERSION..." >&2; exit 2; }
dir=$1 imports=$2
shift 2
probe="import sys; from importlib.metadata import version; $imports; pins = [a.split('==') for a in sys.argv[1:]]; print(' '.join(f'{p}=={version(p)}' for p, _ in pins)); sys.exit(any(version(p) != v for p, v in pins))"
if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "$probe" "$@" >/dev/null 2>&1; then
    echo "reusing $dir"
else
    echo "creating $dir with $*"
    rm -rf "$dir"
    python3 -m venv "$dir"
    "$dir/bin/python" -m pip install -q "$@"
fi
v=$("$dir/bin/python" -c "$probe" "$@") || { echo "scripts/dev/pinned-venv.sh: $dir does not hold $*" >&2; exit 1; }
echo "$dir: $v"
