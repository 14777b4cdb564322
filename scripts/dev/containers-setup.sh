#!/usr/bin/env bash
# Prepares a real container runtime for tests/deployment/containers.rs: podman (Debian's package,
# with runc as its runtime), a configuration of the tests' own, and a base image made
# without any registry. scripts/test.sh runs it; run it alone to run the container tests
# by hand:
#
#   eval "$(scripts/dev/containers-setup.sh --env)"
#   cargo test --release --test deployment containers::
#
# Everything lives under target/containers/ and is reused by later runs:
#   containers.conf   runtime runc, cgroupfs, no network, default ulimits no higher than
#                     this machine's hard limits (podman's own defaults ask for more
#                     open files than a container without CAP_SYS_RESOURCE may have)
#   storage.conf      the tests' own image store (target/containers/storage; made anew
#                     when it was made at another path: see below)
#   base.tar          the base image's root file system: by default made by
#                     scripts/dev/containers-base.py from this machine's own Debian packages
#                     (dash, coreutils, grep, ... and their dependencies: seconds, no
#                     download); with GPUCAP_TEST_BASE=debootstrap, Debian's minbase made by
#                     `debootstrap --variant=minbase` (minutes: it downloads the packages)
#   the image localhost/gpucap-test-base:<host|debootstrap>, imported from base.tar
#   old-glibc.tar     an image with a C library older than the one gpucap's native build
#                     asks for: Debian 11's minbase (glibc 2.31) made by debootstrap (some
#                     40 s of download, once), imported as localhost/gpucap-test-old-glibc:
#                     bullseye, in which the portable build (scripts/build-portable.sh) runs
# Installs podman and runc (and debootstrap) with apt-get when missing, and Debian's
# docker.io (dockerd, its docker client, containerd) when there is no dockerd: the Docker
# tests (tests/deployment/containers/docker.rs) start a dockerd of their own, `docker import`
# base.tar into it and stop it when they end; nothing of Docker runs after this script
# (Debian's policy-rc.d, where there is one, keeps apt-get from starting the service;
# where there is none, a docker service apt-get started is left as it is).
# --env prints the variables tests/deployment/containers.rs reads (GPUCAP_TEST_PODMAN,
# GPUCAP_TEST_CONTAINERS_CONF, GPUCAP_TEST_CONTAINERS_STORAGE_CONF,
# GPUCAP_TEST_CONTAINER_IMAGE, GPUCAP_TEST_OLD_GLIBC_IMAGE, and for Docker
# GPUCAP_TEST_DOCKERD, GPUCAP_TEST_DOCKER, GPUCAP_TEST_CONTAINER_BASE_TAR) instead of a
# summary.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
DIR=$ROOT/target/containers
BASE=${GPUCAP_TEST_BASE:-host}
case $BASE in host | debootstrap) ;; *) echo "GPUCAP_TEST_BASE=$BASE: host or debootstrap" >&2; exit 1 ;; esac
IMAGE=localhost/gpucap-test-base:$BASE
TAR=$DIR/base-$BASE.tar

print_env=false
[ "${1:-}" = --env ] && print_env=true
say() { if $print_env; then echo "# $*" >&2; else echo "$*"; fi; }
die() { printf 'scripts/dev/containers-setup.sh: %s\n' "$*" >&2; exit 1; }

export DEBIAN_FRONTEND=noninteractive
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v dockerd >/dev/null || missing+=(docker.io)
OLD_TAR=$DIR/old-glibc-bullseye.tar
OLD_IMAGE=localhost/gpucap-test-old-glibc:bullseye
if { [ "$BASE" = debootstrap ] && ! [ -s "$TAR" ]; } || ! [ -s "$OLD_TAR" ]; then
    command -v debootstrap >/dev/null || missing+=(debootstrap)
fi
if [ ${#missing[@]} -gt 0 ]; then
    sudo=()
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || die "need root (or sudo) to apt-get install ${missing[*]}"
        sudo=(sudo -n)
    fi
    command -v apt-get >/dev/null || die "missing ${missing[*]}, and no apt-get to install them"
    say "installing with apt-get: ${missing[*]}"
    "${sudo[@]}" apt-get update -q >&2
    # Other builds on this machine may hold dpkg's lock for a while: wait for it.
    "${sudo[@]}" apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=300 \
        "${missing[@]}" >&2
fi
dockerd=$(command -v dockerd) || die "no dockerd after installing docker.io"
# The client of dockerd's own package (docker.io's /usr/bin/docker), not another one
# earlier on PATH: a newer client builds with BuildKit's buildx plugin, which Debian's
# docker.io does not have.
pkg=$(dpkg-query -S "$(readlink -f "$dockerd")" 2>/dev/null | head -n 1 | cut -d: -f1) || true
docker=$( [ -n "$pkg" ] && dpkg-query -L "$pkg" | grep -m 1 '/bin/docker$' || true)
[ -x "$docker" ] || docker=$(command -v docker) || die "dockerd at $dockerd but no docker client"

mkdir -p "$DIR"

# Ulimits: the soft and hard limits of this shell, which a container may keep, except
# that nproc is at most 32768 (measured: podman's conmon runs with 32768 processes here,
# and runc, started under it, may not raise a limit without CAP_SYS_RESOURCE).
min() { if [ "$1" = unlimited ] || { [ "$2" != unlimited ] && [ "$2" -lt "$1" ]; }; then echo "$2"; else echo "$1"; fi; }
nofile_soft=$(ulimit -Sn) nofile_hard=$(ulimit -Hn)
nproc_soft=$(min "$(ulimit -Su)" 32768) nproc_hard=$(min "$(ulimit -Hu)" 32768)
nofile_soft=$(min "$nofile_soft" 1048576) nofile_hard=$(min "$nofile_hard" 1048576)
conf=$DIR/containers.conf
cat >"$conf.tmp" <<EOF
# Written by scripts/dev/containers-setup.sh for tests/deployment/containers.rs.
[containers]
default_ulimits = ["nofile=$nofile_soft:$nofile_hard", "nproc=$nproc_soft:$nproc_hard"]
netns = "none"
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
mv -f "$conf.tmp" "$conf"
storage=$DIR/storage.conf
cat >"$storage.tmp" <<EOF
# Written by scripts/dev/containers-setup.sh for tests/deployment/containers.rs.
[storage]
driver = "overlay"
graphroot = "$DIR/storage"
runroot = "$DIR/run"
EOF
mv -f "$storage.tmp" "$storage"
export CONTAINERS_CONF=$conf CONTAINERS_STORAGE_CONF=$storage
# A store made at another path (target/ copied, or the checkout moved) keeps that path in
# its database, and podman then uses the old store, whose containers' exits it no longer
# sees: every `podman run` waits 20 s for conmon (measured). Such a store is made anew.
if [ -d "$DIR/storage" ]; then
    graphroot=$(podman info --format '{{.Store.GraphRoot}}' 2>/dev/null || true)
    if [ "$graphroot" != "$DIR/storage" ]; then
        say "the image store under $DIR was made at ${graphroot:-another path}: making it anew"
        rm -rf "$DIR/storage" "$DIR/run"
    fi
fi

# The base image's files, made once.
if ! [ -s "$TAR" ] && [ "$BASE" = host ]; then
    say "scripts/dev/containers-base.py $TAR"
    python3 scripts/dev/containers-base.py "$TAR" >&2 || die "scripts/dev/containers-base.py failed"
elif ! [ -s "$TAR" ]; then
    suite=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ -n "$suite" ] || die "cannot tell this machine's Debian suite (/etc/os-release has no VERSION_CODENAME)"
    mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
    mirror=${mirror:-http://deb.debian.org/debian}
    say "debootstrap --variant=minbase $suite ($mirror)"
    rm -rf "$DIR/rootfs"
    debootstrap --variant=minbase "$suite" "$DIR/rootfs" "$mirror" >"$DIR/debootstrap.log" 2>&1 ||
        die "debootstrap failed (see $DIR/debootstrap.log)"
    # No package lists or caches: a smaller image, nothing the tests need.
    rm -rf "$DIR/rootfs/var/cache/apt/archives/"*.deb "$DIR/rootfs/var/lib/apt/lists/"*
    tar -C "$DIR/rootfs" -cf "$TAR.tmp" .
    mv -f "$TAR.tmp" "$TAR"
    rm -rf "$DIR/rootfs"
fi
# The old C library's image, made once: Debian 11 from its mirror, else from Debian's
# archive (where a suite goes when its support ends).
if ! [ -s "$OLD_TAR" ]; then
    say "debootstrap --variant=minbase bullseye (an image with glibc 2.31)"
    rm -rf "$DIR/old-rootfs"
    ok=false
    for mirror in http://deb.debian.org/debian http://archive.debian.org/debian; do
        if debootstrap --variant=minbase bullseye "$DIR/old-rootfs" "$mirror" >"$DIR/debootstrap-old.log" 2>&1; then
            ok=true
            break
        fi
        rm -rf "$DIR/old-rootfs"
    done
    $ok || die "debootstrap of bullseye failed (see $DIR/debootstrap-old.log)"
    rm -rf "$DIR/old-rootfs/var/cache/apt/archives/"*.deb "$DIR/old-rootfs/var/lib/apt/lists/"*
    tar -C "$DIR/old-rootfs" -cf "$OLD_TAR.tmp" .
    mv -f "$OLD_TAR.tmp" "$OLD_TAR"
    rm -rf "$DIR/old-rootfs"
fi
if ! podman image exists "$OLD_IMAGE" 2>/dev/null; then
    say "podman import $OLD_TAR $OLD_IMAGE"
    podman import --quiet "$OLD_TAR" "$OLD_IMAGE" >/dev/null || {
        rm -f "$OLD_TAR"
        die "podman import of $OLD_TAR failed (removed: the next run makes it again)"
    }
fi
if ! podman image exists "$IMAGE" 2>/dev/null; then
    say "podman import $TAR $IMAGE"
    podman import --quiet "$TAR" "$IMAGE" >/dev/null || {
        rm -f "$TAR"
        die "podman import failed (removed $TAR: the next run makes it again)"
    }
fi
out=$(podman run --rm --pull=never "$IMAGE" sh -c 'echo ok' 2>&1) ||
    die "podman cannot run a container here: $out"
[ "$out" = ok ] || die "podman run printed '$out', not ok"

if $print_env; then
    printf 'export GPUCAP_TEST_PODMAN=%q\n' "$(command -v podman)"
    printf 'export GPUCAP_TEST_CONTAINERS_CONF=%q\n' "$conf"
    printf 'export GPUCAP_TEST_CONTAINERS_STORAGE_CONF=%q\n' "$storage"
    printf 'export GPUCAP_TEST_CONTAINER_IMAGE=%q\n' "$IMAGE"
    printf 'export GPUCAP_TEST_DOCKERD=%q\n' "$dockerd"
    printf 'export GPUCAP_TEST_DOCKER=%q\n' "$docker"
    printf 'export GPUCAP_TEST_CONTAINER_BASE_TAR=%q\n' "$TAR"
    printf 'export GPUCAP_TEST_OLD_GLIBC_IMAGE=%q\n' "$OLD_IMAGE"
else
    echo "podman: $(podman --version), runtime runc $(runc --version | head -1 | awk '{print $3}'), image $IMAGE"
    echo "docker: $("$dockerd" --version) ($dockerd, client $docker), base $TAR"
    echo "old C library: $OLD_IMAGE"
fi
