#!/bin/sh
# gpucap's container entrypoint: cap the GPU memory of whatever the container runs.
#
#   ENTRYPOINT ["/usr/local/lib/gpucap/docker-entrypoint.sh"]
#   CMD ["python", "train.py"]
#
# 1. Finds gpucap and libgpucap.so: in $GPUCAP_HOME if set, else in this script's own
#    directory (symlinks resolved) if they are there, else in /usr/local/lib/gpucap if
#    gpucap is there, else the gpucap on PATH (`pip install gpucap`: the library is in
#    its Python package, where `gpucap check` finds it). GPUCAP_LIB, if set, names the
#    library instead.
# 2. One budget for the whole container: unless GPUCAP_POOL (or HAMi-core's
#    CUDA_DEVICE_MEMORY_SHARED_CACHE) is set, exports GPUCAP_POOL=container-mntns, the
#    container's pool, so that every process of the container that uses CUDA, whatever
#    its user, draws on one cap per GPU, and containers that share /dev/shm (--ipc=host)
#    do not share it (its file is gpucap.pool in gpucap-container-N, N the inode of the
#    container's mount namespace, a directory every user of the container may write,
#    under GPUCAP_POOL_DIR, else /dev/shm or /tmp). GPUCAP_POOL=off gives each process its own
#    cap instead; GPUCAP_POOL=NAME or an absolute path names another pool (a pool
#    shared by the containers of a pod, in a memory-backed volume).
# 3. Validates the GPUCAP_* configuration with `gpucap check`: a bad value (or a pool
#    directory other users could write in) stops the container with gpucap's message
#    and exit status 2; the command never runs.
# 4. Writes the validated GPUCAP_* variables (the pool's included) to gpucap.env beside
#    libgpucap.so. The shim reads that file when its environment has no GPUCAP_*
#    variable at all, so processes started through ssh, `su -` or sudo (which drop the
#    environment) stay capped, in the container's pool. If that directory is not
#    writable (a non-root container), it warns and goes on, unless
#    GPUCAP_LD_SO_PRELOAD asks for the system-wide install.
# 5. With GPUCAP_LD_SO_PRELOAD=1 (true/yes/on), adds libgpucap.so to /etc/ld.so.preload
#    (once: the line is not added again), so that every process loads the shim even
#    without LD_PRELOAD. GPUCAP_ETC replaces /etc for this (tests only); it is removed
#    from the environment before anything else sees it.
# 6. Runs `exec gpucap run -- "$@"`: libgpucap.so is appended to LD_PRELOAD (what was
#    there is kept) and gpucap execs the command, so the command ends up with this
#    script's pid: signals reach it directly and its exit status is the container's.
#    127: command not found; 126: not executable.
#
# GPUCAP_LOG=info or debug also prints what `gpucap check` found.
set -u

die() {
    printf 'gpucap-entrypoint: %s\n' "$*" >&2
    exit 2
}

etc=${GPUCAP_ETC:-/etc}
unset GPUCAP_ETC

self=$(readlink -f -- "$0" 2>/dev/null) || self=$0
here=$(dirname -- "$self")
if [ -n "${GPUCAP_HOME:-}" ]; then
    home=$GPUCAP_HOME
elif [ -x "$here/gpucap" ] && [ -f "$here/libgpucap.so" ]; then
    home=$here
elif [ ! -x /usr/local/lib/gpucap/gpucap ] && command -v gpucap >/dev/null 2>&1; then
    home=
else
    home=/usr/local/lib/gpucap
fi
[ "$#" -gt 0 ] || die "no command to run (give the container a command, e.g. docker run IMAGE python train.py)"
if [ -n "$home" ]; then
    gpucap=$home/gpucap
    lib=${GPUCAP_LIB:-$home/libgpucap.so}
else
    # pip's gpucap: it knows where its library is (the line "library: PATH" of check,
    # which also validates the configuration, as below).
    gpucap=$(command -v gpucap)
    out=$("$gpucap" check 2>&1)
    status=$?
    if [ "$status" -ne 0 ]; then
        printf '%s\n' "$out" >&2
        die "the gpucap configuration is not valid (status $status): not starting $1"
    fi
    lib=$(printf '%s\n' "$out" | sed -n 's/^library: //p' | head -n 1)
fi

[ -x "$gpucap" ] || die "cannot find gpucap at $gpucap (set GPUCAP_HOME to the directory that holds gpucap and libgpucap.so)"
[ -f "$lib" ] || die "cannot find libgpucap.so at $lib (set GPUCAP_HOME, or GPUCAP_LIB to the library)"
# An absolute path: /etc/ld.so.preload (and processes started elsewhere) would not find a
# relative one, and run uncapped.
case $lib in
    /*) ;;
    *) lib=$PWD/$lib ;;
esac
# LD_PRELOAD and /etc/ld.so.preload split their lists on spaces and colons, with no escape.
case $lib in
    *[[:space:]:]*) die "the path of libgpucap.so ($lib) contains a space or a colon, which LD_PRELOAD and /etc/ld.so.preload cannot express: install gpucap in a directory without them (GPUCAP_HOME), or set GPUCAP_LIB to such a path" ;;
esac

ld_so_preload=false
case $(printf '%s' "${GPUCAP_LD_SO_PRELOAD:-0}" | tr '[:upper:]' '[:lower:]' | tr -d ' \t') in
    1 | true | yes | on) ld_so_preload=true ;;
esac

# One budget per container by default: the processes share the container's pool, one
# per mount namespace (each container has its own, `docker exec` enters it), so that
# containers sharing one /dev/shm (--ipc=host, a pod's containers) keep apart, and
# shared by the container's users (the shim and gpucap read the name so).
if [ -z "${GPUCAP_POOL+set}" ] && [ -z "${CUDA_DEVICE_MEMORY_SHARED_CACHE+set}" ]; then
    GPUCAP_POOL=container-mntns
    export GPUCAP_POOL
fi

# Validate, and write gpucap.env beside the library when it can be written: its directory
# writable, and the file, where one is there, too (a ConfigMap mounted read-only there is
# the operator's, and a ceiling: checked, never written).
env_file=$(dirname -- "$lib")/gpucap.env
env_writable=false
if [ -w "$(dirname -- "$lib")" ] && { ! [ -e "$env_file" ] || { [ -f "$env_file" ] && [ -w "$env_file" ]; }; }; then
    env_writable=true
fi
if $env_writable; then
    out=$("$gpucap" check --write-env "$env_file" 2>&1)
else
    out=$("$gpucap" check 2>&1)
fi
status=$?
if [ "$status" -ne 0 ]; then
    printf '%s\n' "$out" >&2
    die "the gpucap configuration is not valid (status $status): not starting $1"
fi
case ${GPUCAP_LOG:-} in
    [Ii][Nn][Ff][Oo] | [Dd][Ee][Bb][Uu][Gg]) printf '%s\n' "$out" >&2 ;;
esac
if ! $env_writable; then
    $ld_so_preload && die "cannot write $env_file, which GPUCAP_LD_SO_PRELOAD needs (processes without GPUCAP_* variables read it)"
    printf 'gpucap-entrypoint: warning: cannot write %s: processes that lose the environment (su -, ssh, sudo) will not be capped\n' "$env_file" >&2
fi

# The system-wide install, once.
if $ld_so_preload; then
    preload_file=$etc/ld.so.preload
    if ! { [ -f "$preload_file" ] && grep -qxF -- "$lib" "$preload_file"; }; then
        tmp=$preload_file.gpucap.$$
        if ! {
            {
                if [ -s "$preload_file" ]; then
                    cat -- "$preload_file"
                    # A last line without its newline would run into ours.
                    [ "$(tail -c 1 -- "$preload_file" | wc -l)" -eq 1 ] || echo
                fi
                printf '%s\n' "$lib"
            } >"$tmp" && chmod 644 "$tmp" && mv -f -- "$tmp" "$preload_file"
        }; then
            rm -f -- "$tmp"
            die "cannot add $lib to $preload_file"
        fi
    fi
fi

exec "$gpucap" run -- "$@"
