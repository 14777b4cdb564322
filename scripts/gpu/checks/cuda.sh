# shellcheck shell=bash
# Checks of scripts/gpu-check.sh (sourced by it; its CHECKS list names them): a CUDA
# C++ program built by nvcc (scripts/gpu/cap_check.cu), with the static and the shared
# cudart.
# shellcheck disable=SC2317

cuda_check() { # NAME BIN
    local name=$1 bin=$2 rep=$LOGDIR/$1.report.json
    capped "$rep"
    if ! probe "${CAPPED[@]}" "$bin" "$CAP"; then
        verdict "$name"
        return
    fi
    local msg=$PROBE_MSG
    report_ok "$name" "$rep" --expect-refusal || return
    pass "$name" "$msg"
}

# has_cudart GLOB: 0 when a CUDA runtime library (GLOB) is beside nvcc, else SKIP $name.
has_cudart() {
    local d
    while read -r d; do
        if compgen -G "$d/$2" >/dev/null; then
            return 0
        fi
    done < <(cuda_lib_dirs)
    if [ -n "$NVCC" ]; then
        skip "$1" "no CUDA runtime ($2) in the lib folders of $NVCC"
        return 1
    fi
    return 0 # build says nvcc is missing
}

check_cuda_static() {
    local bin=$BUILD/cap_check_static
    has_cudart "$1" 'libcudart_static.a' || return
    build "$1" "$bin" "$SRC_DIR/cap_check.cu" || return
    # (not `ldd | grep -q`: with pipefail, grep quitting at the first match can make ldd
    # die of SIGPIPE and the pipeline false, so a shared cudart would go unnoticed)
    local linked
    linked=$(ldd "$bin" 2>/dev/null)
    if grep -q 'libcudart\.so' <<<"$linked"; then
        fail "$1" "$bin links libcudart.so: nvcc's default should be the static cudart"
        return
    fi
    cuda_check "$1" "$bin"
}

check_cuda_shared() {
    local bin=$BUILD/cap_check_shared rpath=() d
    has_cudart "$1" 'libcudart.so*' || return
    while read -r d; do
        if compgen -G "$d/libcudart.so*" >/dev/null; then
            rpath=(-Xlinker -rpath -Xlinker "$d")
            break
        fi
    done < <(cuda_lib_dirs)
    build "$1" "$bin" "$SRC_DIR/cap_check.cu" -cudart shared ${rpath[@]+"${rpath[@]}"} || return
    local linked
    linked=$(ldd "$bin" 2>&1 | grep 'libcudart\.so')
    if [ -z "$linked" ]; then
        fail "$1" "$bin does not link libcudart.so (-cudart shared)"
        return
    fi
    if grep -q 'not found' <<<"$linked"; then
        fail "$1" "libcudart.so not found at run time: $linked"
        return
    fi
    cuda_check "$1" "$bin"
}
