#!/usr/bin/env bash
# Builds the gpucap wheel (python/pyproject.toml) into target/wheels/:
#
#   scripts/build-wheel.sh
#
# The wheel holds the `gpucap` command (src/cli, built by maturin as a native
# executable: bindings "bin") and the Python package python/gpucap with libgpucap.so,
# the shim, built here (scripts/build-portable.sh) and copied into the package first (maturin builds one
# crate; the shim is another). Debug information is stripped from both (the workspace's
# release profile keeps it for the repository's own builds): about a quarter of the size.
#
# maturin (and auditwheel, which checks every ELF file of the wheel, the shim included,
# where maturin's own check reads only the executable) come from PyPI, pinned, in
# target/venv-maturin (reused), zig from scripts/build-portable.sh's target/venv-zig. Both ELF files are linked by zig against glibc 2.27's
# symbols: the shim by scripts/build-portable.sh, the command by maturin --zig. The
# platform tag is what auditwheel then says: manylinux_2_27 (Ubuntu 18.04 on, Debian 10 on,
# RHEL 8 on; a native build on Debian 12 made manylinux_2_35).
# Prints the wheel's path last.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

VENV=target/venv-maturin
pins=(maturin==1.16.0 auditwheel==6.8.2)
scripts/dev/pinned-venv.sh "$VENV" pass "${pins[@]}" >&2

scripts/build-portable.sh --out target/wheel-portable >&2
install -m 755 target/wheel-portable/libgpucap.so python/gpucap/libgpucap.so
strip --strip-debug python/gpucap/libgpucap.so

# The tag maturin would give from the executable alone may be too new for the shim:
# auditwheel reads both, and the wheel is tagged with what it says.
# maturin builds the executable in a target directory of its own: its flags (--strip)
# differ from the workspace's, and sharing target/release would rebuild both in turn.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}/wheel-build
GLIBC_TAG=manylinux_2_27
# maturin finds zig through `python3 -m ziglang`: scripts/build-portable.sh's venv's.
export PATH=$PWD/target/venv-zig/bin:$PATH
out=target/wheels
rm -f "$out"/gpucap-*.whl
(cd python && "../$VENV/bin/maturin" build --release --strip --zig --compatibility "$GLIBC_TAG" -o "../$out" >&2)
raw=$(ls "$out"/gpucap-*.whl)
tag=$("$VENV/bin/auditwheel" show "$raw" | tr -d '\n' | sed -n 's/.*consistent with the *following platform tag: *"\([^"]*\)".*/\1/p')
[ -n "$tag" ] || { "$VENV/bin/auditwheel" show "$raw" >&2; echo "build-wheel.sh: auditwheel gave no platform tag" >&2; exit 1; }
(cd python && "../$VENV/bin/maturin" build --release --strip --zig --compatibility "${tag%_x86_64}" -o "../$out.tagged" >&2)
rm -f "$raw"
mv "$out.tagged"/gpucap-*.whl "$out/"
rmdir "$out.tagged"
ls "$out"/gpucap-*.whl
