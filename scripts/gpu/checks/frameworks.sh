# shellcheck shell=bash
# Checks of scripts/gpu-check.sh (sourced by it; its CHECKS list names them): PyTorch
# (three allocators, growth mode against its control, eager loading), JAX (three ways to allocate), CuPy
# (two pools) and numba (the driver API through cuda-bindings), each judged by what the framework sees and by gpucap's report.
# shellcheck disable=SC2317

torch_check() { # NAME ALLOC_CONF
    local name=$1 conf=$2 rep=$LOGDIR/$1.report.json
    needs_fw torch "$name" || return
    capped "$rep"
    local envs=()
    if [ -n "$conf" ]; then
        envs=(env "PYTORCH_CUDA_ALLOC_CONF=$conf")
    fi
    if ! probe ${envs[@]+"${envs[@]}"} "${CAPPED[@]}" "$PY" "$PROBE" torch --cap "$CAP"; then
        verdict "$name"
        return
    fi
    local msg=$PROBE_MSG
    report_ok "$name" "$rep" --expect-refusal || return
    pass "$name" "$msg"
}
check_torch_default() { torch_check "$1" ""; }
check_torch_expandable_segments() { torch_check "$1" "expandable_segments:True"; }
check_torch_cudaMallocAsync() { torch_check "$1" "backend:cudaMallocAsync"; }

growth_check() { # NAME MODE (growth|release)
    local name=$1 mode=$2 rep=$LOGDIR/$1.report.json
    needs_fw torch "$name" || return
    rm -f "$rep"
    local holder=("$CLI" run --limit "$CAP" --report "$rep")
    local fill=()
    if [ "$mode" = growth ]; then
        holder+=(--growth)
    fi
    holder+=(-- "$PY" "$PROBE" growth-holder)
    if [ "$NO_FILL" = 1 ]; then
        fill=(--no-fill)
    fi
    if ! probe "$PY" "$PROBE" growth --cap "$CAP" --mode "$mode" --timeout $((TIMEOUT - 30)) ${fill[@]+"${fill[@]}"} -- "${holder[@]}"; then
        verdict "$name"
        return
    fi
    local msg=$PROBE_MSG growth=()
    if [ "$mode" = growth ]; then
        growth=(--growth)
    fi
    report_ok "$name" "$rep" ${growth[@]+"${growth[@]}"} || return
    pass "$name" "$msg"
}
check_torch_release() { growth_check "$1" release; }
check_torch_growth() { growth_check "$1" growth; }

# Under CUDA's eager loading a library is loaded into the context at its load: gpucap's
# charge never below what the driver holds for the process (scripts/gpu/eager_loading.py).
check_torch_eager() { # NAME
    local name=$1
    needs_fw torch "$name" || return
    capped "$LOGDIR/$name.report.json"
    probe env CUDA_MODULE_LOADING=EAGER "${CAPPED[@]}" "$PY" "$(dirname "$PROBE")/eager_loading.py" --cap "$CAP"
    verdict "$name"
}

jax_check() { # NAME PROBE_CMD [VAR=VALUE...]
    local name=$1 cmd=$2 rep=$LOGDIR/$1.report.json
    shift 2
    needs_fw jax "$name" || return
    capped "$rep"
    local envs=()
    if [ $# -gt 0 ]; then
        envs=(env "$@")
    fi
    if ! probe ${envs[@]+"${envs[@]}"} "${CAPPED[@]}" "$PY" "$PROBE" "$cmd" --cap "$CAP"; then
        verdict "$name"
        return
    fi
    local msg=$PROBE_MSG
    case $name in
        jax-preallocate) report_ok "$name" "$rep" --min-peak $((CAP / 2)) || return ;;
        jax-platform-allocator) report_ok "$name" "$rep" --expect-refusal || return ;;
        *) report_ok "$name" "$rep" || return ;;
    esac
    pass "$name" "$msg"
}
check_jax_preallocate() { jax_check "$1" jax-preallocate; }
check_jax_no_preallocate() { jax_check "$1" jax-grow XLA_PYTHON_CLIENT_PREALLOCATE=false; }
check_jax_platform_allocator() { jax_check "$1" jax-grow XLA_PYTHON_CLIENT_ALLOCATOR=platform; }

cupy_check() { # NAME POOL
    local name=$1 pool=$2 rep=$LOGDIR/$1.report.json
    needs_fw cupy "$name" || return
    capped "$rep"
    if ! probe "${CAPPED[@]}" "$PY" "$PROBE" cupy --cap "$CAP" --pool "$pool"; then
        verdict "$name"
        return
    fi
    local msg=$PROBE_MSG
    report_ok "$name" "$rep" --expect-refusal || return
    pass "$name" "$msg"
}
check_cupy_default_pool() { cupy_check "$1" default; }
check_cupy_async_pool() { cupy_check "$1" async; }

check_numba() { # NAME
    local name=$1 rep=$LOGDIR/$1.report.json
    needs_fw numba "$name" || return
    capped "$rep"
    if ! probe "${CAPPED[@]}" "$PY" "$PROBE" numba --cap "$CAP"; then
        verdict "$name"
        return
    fi
    local msg=$PROBE_MSG
    report_ok "$name" "$rep" --expect-refusal || return
    pass "$name" "$msg"
}
