#!/usr/bin/env bash
# Measures the build of the test suite from clean: what scripts/test.sh builds (its
# `cargo build` step, then the `cargo test --no-run` of its test step) in a fresh target
# directory, timed by /usr/bin/time. Prints the CPU seconds (user + sys, of cargo and every
# rustc and linker it ran), the wall seconds and the number of test binaries.
#
#   scripts/dev/measure-test-build.sh [TARGET_DIR]
#
# TARGET_DIR (default /tmp/gpucap-measure-build) is emptied first and removed at the end;
# the checkout's own target/ is left alone. CPU seconds are the figure to compare between
# two builds on a shared machine: wall time grows with whatever else the machine runs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

dir=${1:-/tmp/gpucap-measure-build}
case $dir in
/*) ;;
*) echo "measure-test-build.sh: TARGET_DIR must be an absolute path, got '$dir'" >&2; exit 2 ;;
esac
rm -rf "$dir"
mkdir -p "$dir"
export CARGO_TARGET_DIR=$dir
times=$dir.time

# The build commands of scripts/test.sh, in its order: the workspace with the release
# profile, the integration tests (the package gpucap-tests) with the profile test-release.
build() {
    cargo build --release --workspace --all-targets --exclude gpucap-tests
    cargo test --release --workspace --exclude gpucap-tests --no-run
    cargo test --profile test-release -p gpucap-tests --no-run
}

echo "building from clean in $dir ($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg))"
export -f build
/usr/bin/time -f '%U %S %e' -o "$times" bash -c build
read -r user sys wall <"$times"
rm -f "$times"

# Test binaries: the integration test targets (tests/) and the unit tests of the crates.
read -r integration units < <({
    cargo test --release --workspace --exclude gpucap-tests --no-run --message-format=json
    cargo test --profile test-release -p gpucap-tests --no-run --message-format=json
} 2>/dev/null |
    python3 -c 'import json, sys
integration = units = 0
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        if m["target"]["kind"] == ["test"]:
            integration += 1
        else:
            units += 1
print(integration, units)')
rm -rf "$dir"

cpu=$(python3 -c "print(round($user + $sys))")
echo "build of the test suite from clean: ${cpu} CPU s (user ${user} s, sys ${sys} s), ${wall} s wall"
echo "test binaries: ${integration} integration (tests/), ${units} unit-test binaries of the crates"
