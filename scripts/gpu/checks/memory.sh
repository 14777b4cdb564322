# shellcheck shell=bash
# Checks of scripts/gpu-check.sh (sourced by it): growth mode's footprint, the escapes
# of tests/c/escapes.c on this driver, and what gpucap charges against what the driver
# counts for each process (NVML's per-process used memory). The driver-API versions
# run anywhere (the fake GPU in CI); the PyTorch, JAX and CuPy ones where they work.
# shellcheck disable=SC2317

CHECKS+=(growth-footprint
    escape-vmm-release escape-pool-cumemfree escape-pool-other-gpu escape-page-rounding
    escape-module-globals escape-stack-limit escape-local-stack escape-legacy-launch escape-multi-device escape-lazy-kernels
    escape-library-global escape-capture-lazy escape-graph-node escape-graph-generic-node escape-green-context
    escape-deepbind
    accounting-driver accounting-torch accounting-jax accounting-cupy)

ACCOUNTING=$SRC_DIR/accounting.py

needs_py() { # NAME: 0 with a Python, else SKIP NAME
    if [ "$PY_OK" = 1 ]; then
        return 0
    fi
    skip "$1" "no Python 3 ('$PY' not found)"
    return 1
}

# growth mode, PyTorch where it works: empty_cache() keeps the footprint, small blocks
# take their size; else the same with cuMemAlloc_v2 / cuMemFree_v2.
check_growth_footprint() {
    needs_py "$1" || return
    local g=("$CLI" run --growth --limit "$CAP" --)
    if fw_available torch; then
        probe "${g[@]}" "$PY" "$ACCOUNTING" growth --client torch --cap "$CAP" --part keep || {
            verdict "$1"
            return
        }
        local kept=$PROBE_MSG
        probe env PYTORCH_NO_CUDA_MEMORY_CACHING=1 "${g[@]}" "$PY" "$ACCOUNTING" growth --client torch \
            --cap "$CAP" --part small || {
            verdict "$1"
            return
        }
        pass "$1" "$kept; ${PROBE_MSG#torch in growth mode: } (PYTORCH_NO_CUDA_MEMORY_CACHING=1)"
        return
    fi
    probe "${g[@]}" "$PY" "$ACCOUNTING" growth --client driver --cap "$CAP" --part both
    verdict "$1"
}

escape_check() { # NAME MODE [env -u CUDA_VISIBLE_DEVICES]
    local name=$1 mode=$2
    shift 2
    needs_py "$name" || return
    probe "$@" "$CLI" run --limit "$CAP" -- "$PY" "$SRC_DIR/escapes.py" "$mode" --cap "$CAP"
    verdict "$name"
}
check_escape_vmm_release() { escape_check "$1" vmm-release; }
check_escape_pool_cumemfree() { escape_check "$1" pool-cumemfree; }
# every GPU visible: GPU 1's pool needs a GPU 1
check_escape_pool_other_gpu() { escape_check "$1" pool-other-gpu env -u CUDA_VISIBLE_DEVICES; }
# the driver's 2 MiB pages against gpucap's charge of the bytes asked for
check_escape_page_rounding() { escape_check "$1" page-rounding; }
# a module's __device__ globals, taken at load
check_escape_module_globals() { escape_check "$1" module-globals; }
# a larger stack (cuCtxSetLimit), taken at the call
check_escape_stack_limit() { escape_check "$1" stack-limit; }
# a kernel's local memory: the stack the driver grows to it at its launch
check_escape_local_stack() { escape_check "$1" local-stack; }
# the same kernels launched by the deprecated cuLaunchGrid (cuFuncSetBlockShape, cuParamSetv)
check_escape_legacy_launch() { escape_check "$1" legacy-launch; }
# ... and by the deprecated cuLaunchCooperativeKernelMultiDevice (one device, a stream of its own)
# ... and by the deprecated cuLaunchCooperativeKernelMultiDevice (one device, a stream of its own)
check_escape_multi_device() { escape_check "$1" multi-device; }
# a library's global and code, loaded at its kernel's first launch
check_escape_lazy_kernels() { escape_check "$1" lazy-kernels; }
# the same library loaded for its global (cuLibraryGetGlobal) before any kernel of it ran
check_escape_library_global() { escape_check "$1" library-global; }
# the same, the kernel's first launch inside a stream capture
check_escape_capture_lazy() { escape_check "$1" capture-lazy; }
# the same, the kernel put into a graph built by hand (a kernel node, never launched)
check_escape_graph_node() { escape_check "$1" graph-node; }
# the same node made by CUDA 12.2's generic cuGraphAddNode_v2
check_escape_graph_generic_node() { escape_check "$1" graph-generic-node; }
# green contexts: the primary context the first one retains (makes), and each one's own part
check_escape_green_context() { escape_check "$1" green-context; }

# A library opened with RTLD_DEEPBIND (Julia's default for every library it loads) and the
# eight ways it reaches the driver (tests/c/libdeepbind.c: linked with -lcuda, dlsym on
# libcuda's handle, cuGetProcAddress, dlsym(RTLD_DEFAULT), dlsym(RTLD_NEXT), and dlsym on
# libcuda's handle through the C library's own dlsym taken by dlvsym from the global scope,
# by dlvsym(RTLD_NEXT) and by dlsym(RTLD_NEXT, "dlsym")): each fits 0.6 x the cap once
# and is refused 0.6 x the cap more (tests/c/deepbind.c, built here with the host C
# compiler against this driver), the library opened each of four ways. Uncapped, or
# under a shim without its own dlopen and dlvsym, the second of each is served.
check_escape_deepbind() {
    local name=$1 dir=$BUILD/deepbind src=$ROOT/tests/c cc=${CC:-cc} d
    if ! command -v "$cc" >/dev/null 2>&1; then
        skip "$name" "no host C compiler ($cc)"
        return
    fi
    local flags=()
    mapfile -t flags < <(cuda_link_flags)
    flags+=(-O1 -I"$src")
    # The driver the run is on where it is not in the linker's folders (the fake GPU).
    local dirs=()
    IFS=: read -ra dirs <<<"${LD_LIBRARY_PATH:-}"
    for d in ${dirs[@]+"${dirs[@]}"}; do
        [ -n "$d" ] && flags+=("-L$d")
    done
    mkdir -p "$dir"
    if ! run_logged "$LOGDIR/.out" "$cc" "${flags[@]}" -shared -fPIC -o "$dir/libdeepbind.so" \
        "$src/libdeepbind.c" -lcuda -ldl ||
        ! run_logged "$LOGDIR/.out" "$cc" "${flags[@]}" -rdynamic -o "$dir/deepbind" "$src/deepbind.c" -lcuda -ldl; then
        fail "$name" "$cc failed to build tests/c/deepbind.c and libdeepbind.c"
        return
    fi
    local out=$LOGDIR/.out how
    # Opened by dlopen, by dlmopen(LM_ID_BASE), by the dlopen dlsym finds on the C
    # library's handle and by the dlopen dlvsym finds by its version.
    for how in dlopen dlmopen libc versioned; do
        if ! run_logged "$out" "$CLI" run --limit "$CAP" -- "$dir/deepbind" deepbind "$CAP" "$dir/libdeepbind.so" "$how"; then
            fail "$name" "opened by $how: $(grep -E '^(FAIL|FATAL)' "$out" | head -n 3 | tr '\n' ' ')"
            return
        fi
    done
    pass "$name" "a library opened with RTLD_DEEPBIND (by dlopen, dlmopen(LM_ID_BASE), the C library's own dlopen and the dlopen dlvsym finds) kept its own definitions, and linked, by dlsym on libcuda's handle, by cuGetProcAddress, by dlsym(RTLD_DEFAULT), by dlsym(RTLD_NEXT) and through the C library's own dlsym (by dlvsym, dlvsym(RTLD_NEXT) and dlsym(RTLD_NEXT)) 0.6 x the cap fit once and was refused the second time"
}

# accounting_check NAME CLIENT: gpucap's charge against the driver's figure, and how the
# first context was measured (the shim's debug line: by NVML, no temporary context).
accounting_check() {
    local name=$1 client=$2
    needs_py "$name" || return
    if [ "$client" != driver ]; then
        needs_fw "$client" "$name" || return
    fi
    if ! probe env XLA_PYTHON_CLIENT_PREALLOCATE=false "$CLI" run --limit "$CAP" --log debug -- \
        "$PY" "$ACCOUNTING" charge --client "$client" --cap "$CAP"; then
        verdict "$name"
        return
    fi
    local msg=$PROBE_MSG out=$LOGDIR/.out how
    how=$(grep -m 1 'the first context on GPU 0 is measured' "$out" | sed 's/.*is measured //')
    case $how in
        "by NVML's free memory before and after (no other context made)")
            pass "$name" "$msg; the first context measured by NVML, no temporary context" ;;
        "") fail "$name" "the shim did not say how the first context was measured (GPUCAP_LOG=debug)" ;;
        *) fail "$name" "the first context was measured $how" ;;
    esac
}
check_accounting_driver() { accounting_check "$1" driver; }
check_accounting_torch() { accounting_check "$1" torch; }
check_accounting_jax() { accounting_check "$1" jax; }
check_accounting_cupy() { accounting_check "$1" cupy; }
