#!/usr/bin/env bash
# PyTorch, JAX and TensorFlow, unmodified from their PyPI wheels, on gpucap's fake GPU:
# alone, then under gpucap. Needs no GPU. Installs the frameworks in their own virtual
# environments (target/venv-torch, target/venv-jax, target/venv-tf: 4 to 6.5 GB each, reused
# when present; the download and install time is printed), builds the fake GPU and the
# shim, runs tests/clients/torch_client.py, jax_client.py and tf_client.py and checks what
# they print and what the fake driver recorded (FAKECUDA_STATS). Prints one line per check
# and a summary; exits 1 if any check failed.
#
#   scripts/dev/frameworks.sh            # all three
#   scripts/dev/frameworks.sh torch      # or: jax, tf (or several: torch tf)
#
# JAX looks for /dev/nvidiactl (or /dev/nvidia0) before it tries CUDA at all, which is not
# the driver's to answer (docs/src/fake-gpu.md, "Frameworks on the fake GPU"): JAX runs in a private mount
# namespace (unshare, as root) where /dev holds an empty nvidiactl beside the usual nodes.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
ROOT=$PWD
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

TORCH_SPEC=(torch==2.15.0 numpy==2.4.6)
# jax 0.11 and later need Python 3.12; the machine has 3.11.
JAX_SPEC=("jax[cuda13]==0.10.2")
# TensorFlow's GPU build uses CUDA 12 (cudart 12.9 here) from these wheels.
TF_SPEC=("tensorflow[and-cuda]==2.21.0" numpy==2.4.6 nvidia-cublas-cu12==12.9.3.13
    nvidia-cuda-cupti-cu12==12.9.79 nvidia-cuda-nvcc-cu12==12.9.86 nvidia-cuda-nvrtc-cu12==12.9.86
    nvidia-cuda-runtime-cu12==12.9.79 nvidia-cudnn-cu12==9.28.0.42 nvidia-cufft-cu12==11.4.1.4
    nvidia-curand-cu12==10.3.10.19 nvidia-cusolver-cu12==11.7.5.82 nvidia-cusparse-cu12==12.5.10.65
    nvidia-nccl-cu12==2.32.3 nvidia-nvjitlink-cu12==12.9.86)

want=("${@:-torch jax tf}")
want=" ${want[*]} "

section() { printf '\n===== %s =====\n' "$*"; }
passed=0
failed=0
results=()

# make_venv DIR PROBE SPEC...: the venv, created (and timed) unless it already works.
make_venv() {
    local dir=$1 probe=$2
    shift 2
    if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "$probe" >/dev/null 2>&1; then
        echo "reusing $dir"
        return 0
    fi
    echo "creating $dir with $*"
    rm -rf "$dir"
    local start=$SECONDS
    python3 -m venv "$dir" && "$dir/bin/python" -m pip install -q "$@" || return 1
    echo "$dir: downloaded and installed in $((SECONDS - start)) s ($(du -sh "$dir" | cut -f1))"
}

section "Build (fake GPU, shim, CLI)"
cargo build --release -p cuda-stubs -p fake-nvml -p gpucap-shim -p gpucap || exit 1
FAKE=$ROOT/target/release/fakecuda-frameworks
mkdir -p "$FAKE"
ln -sfn "$ROOT/target/release/libcuda.so" "$FAKE/libcuda.so.1"
ln -sfn "$ROOT/target/release/libcuda.so" "$FAKE/libcuda.so"
ln -sfn "$ROOT/target/release/libnvidia_ml.so" "$FAKE/libnvidia-ml.so.1"
SHIM=$ROOT/target/release/libgpucap.so
GPUCAP=$ROOT/target/release/gpucap
OUT=$ROOT/target/frameworks-out
rm -rf "$OUT"
mkdir -p "$OUT"

# /dev with an empty nvidiactl, for JAX (run inside `unshare -m`).
FAKEDEV=$OUT/fakedev.sh
cat >"$FAKEDEV" <<'EOF'
#!/bin/sh
set -e
D=$(mktemp -d)
mount -t tmpfs -o mode=755 fakedev "$D"
for n in null zero full random urandom tty; do
    if [ -e /dev/$n ]; then touch "$D/$n"; mount --bind /dev/$n "$D/$n"; fi
done
for d in shm pts mqueue; do
    if [ -d /dev/$d ]; then mkdir "$D/$d"; mount --rbind /dev/$d "$D/$d"; fi
done
ln -s /proc/self/fd "$D/fd"
ln -s /proc/self/fd/0 "$D/stdin"; ln -s /proc/self/fd/1 "$D/stdout"; ln -s /proc/self/fd/2 "$D/stderr"
touch "$D/nvidiactl"
mount --rbind "$D" /dev
exec "$@"
EOF
chmod +x "$FAKEDEV"

# run NAME [VAR=VALUE...] -- CMD...: runs CMD on the fake GPU (no inherited GPUCAP_*,
# FAKECUDA_*, LD_PRELOAD, CUDA_VISIBLE_DEVICES), output in $OUT/NAME.{out,err,stats.json}.
run() {
    local name=$1
    shift
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    CUR=$OUT/$name
    env -u LD_PRELOAD -u CUDA_VISIBLE_DEVICES $(env | grep -oE '^(GPUCAP|FAKECUDA)_[A-Z0-9_]*' | sed 's/^/-u /') \
        LD_LIBRARY_PATH="$FAKE" FAKECUDA_STATS="$CUR.stats.json" PYTHONDONTWRITEBYTECODE=1 \
        "${envs[@]}" timeout 600 "$@" >"$CUR.out" 2>"$CUR.err"
    CUR_RC=$?
    CUR_NAME=$name
    CUR_FAILS=()
}

fail() { CUR_FAILS+=("$*"); }
# expect_rc0, expect_line REGEX, expect_count REGEX N, expect_err REGEX, expect_stats PYEXPR
expect_done() {
    [ "$CUR_RC" = 0 ] || fail "exit status $CUR_RC"
    grep -qx done "$CUR.out" || fail "did not reach its end"
}
expect_line() { grep -qE "$1" "$CUR.out" || fail "no line /$1/"; }
expect_count() {
    local n
    n=$(grep -cE "$1" "$CUR.out")
    [ "$n" = "$2" ] || fail "/$1/ $n times, expected $2"
}
expect_err() { grep -qE "$1" "$CUR.err" || fail "stderr has no /$1/"; }
expect_no_err() { ! grep -qE "$1" "$CUR.err" || fail "stderr has /$1/"; }
expect_err_at_most() {
    local n
    n=$(grep -cE "$1" "$CUR.err")
    [ "$n" -le "$2" ] || fail "stderr has /$1/ $n times, at most $2 expected"
}
# PYEXPR over d = the stats' devices list, e.g. 'd[0]["peak_used"] <= 1<<30'
expect_stats() {
    python3 -c "import json,sys; d=json.load(open(sys.argv[1]))['devices']; sys.exit(0 if ($1) else 1)" \
        "$CUR.stats.json" 2>/dev/null || fail "stats: not ($1): $(cat "$CUR.stats.json" 2>/dev/null)"
}
verdict() {
    local what=$1
    if [ ${#CUR_FAILS[@]} = 0 ]; then
        passed=$((passed + 1))
        results+=("PASS $CUR_NAME: $what")
        echo "PASS $CUR_NAME: $what"
    else
        failed=$((failed + 1))
        results+=("FAIL $CUR_NAME: $what (${CUR_FAILS[*]})")
        echo "FAIL $CUR_NAME: $what"
        printf '  %s\n' "${CUR_FAILS[@]}"
        echo "  --- stdout: $CUR.out (tail)"; tail -n 15 "$CUR.out" | sed 's/^/  /'
        echo "  --- stderr: $CUR.err (tail)"; grep -v '^fake' "$CUR.err" | tail -n 15 | sed 's/^/  /'
    fi
}

GIB=$((1 << 30))
MIB=$((1 << 20))

if [[ $want == *" torch "* ]]; then
    section "PyTorch (${TORCH_SPEC[*]})"
    torch_probe="import torch; assert torch.version.cuda; print(torch.__version__)"
    if make_venv target/venv-torch "$torch_probe" "${TORCH_SPEC[@]}"; then
        PY=$ROOT/target/venv-torch/bin/python
        C=$ROOT/tests/clients/torch_client.py
        echo "torch $($PY -c "$torch_probe")"

        run torch-plain FAKECUDA_TOTAL_MEM=4Gi -- "$PY" "$C" info meminfo fill:512 stats free stats copy:64 kernel
        expect_done
        expect_line "^available True count 1$"
        expect_line "^device 0 name=FakeCUDA_Device_0 total=$((4 * GIB)) cc=9.0$"
        expect_line "^mem_get_info free=$((4 * GIB)) total=$((4 * GIB))$"
        expect_count "^alloc 512 ok$" 8
        expect_line "^alloc 512 err OutOfMemoryError$"
        expect_line "^stats allocated=$((4 * GIB)) reserved=$((4 * GIB))$"
        expect_line "^freed allocated=0 reserved=0$"
        expect_line "^copy 64 ok$"
        expect_line "^kernel ok"
        expect_stats "d[0]['peak_used'] == 4 << 30"
        verdict "is_available, properties, mem_get_info, torch.empty until torch.OutOfMemoryError, memory_allocated/reserved, empty_cache, .cuda()/.cpu() of real bytes, a kernel launched (no-op)"

        run torch-cap LD_PRELOAD="$SHIM" GPUCAP_LIMIT=1Gi FAKECUDA_TOTAL_MEM=4Gi -- "$PY" "$C" meminfo fill:100 stats free stats meminfo
        expect_done
        expect_line "^mem_get_info free=$GIB total=$GIB$"
        expect_count "^alloc 100 ok$" 10
        expect_line "^alloc 100 err OutOfMemoryError$"
        expect_err "^gpucap: refused cuMemAlloc of 100 MiB on GPU 0: 1000 MiB of the 1 GiB cap in use$"
        expect_line "^stats allocated=$((1000 * MIB)) reserved=$((1000 * MIB))$"
        expect_line "^freed allocated=0 reserved=0$"
        expect_stats "d[0]['peak_used'] <= 1 << 30 and d[0]['final_used'] == 0"
        verdict "1 GiB cap: mem_get_info shows it, torch.OutOfMemoryError with gpucap's line, empty_cache gives the memory back, driver peak <= cap"

        run torch-fraction LD_PRELOAD="$SHIM" GPUCAP_LIMIT=25% FAKECUDA_TOTAL_MEM=4Gi -- "$PY" "$C" meminfo fill:128
        expect_done
        expect_line "^mem_get_info free=$GIB total=$GIB$"
        expect_count "^alloc 128 ok$" 8
        expect_err "^gpucap: refused cuMemAlloc of 128 MiB on GPU 0"
        expect_stats "d[0]['peak_used'] <= 1 << 30"
        verdict "a fraction cap (GPUCAP_LIMIT=25% of 4 GiB)"

        run torch-set-fraction LD_PRELOAD="$SHIM" GPUCAP_LIMIT=1Gi FAKECUDA_TOTAL_MEM=4Gi -- "$PY" "$C" fraction:0.5 fill:100
        expect_done
        expect_count "^alloc 100 ok$" 5
        expect_line "^alloc 100 err OutOfMemoryError$"
        expect_no_err "^gpucap: refused"
        expect_stats "d[0]['peak_used'] <= 512 << 20"
        verdict "set_per_process_memory_fraction(0.5) is of the cap gpucap shows (PyTorch refuses at 512 MiB itself)"

        run torch-expandable LD_PRELOAD="$SHIM" GPUCAP_LIMIT=1Gi FAKECUDA_TOTAL_MEM=4Gi \
            PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- "$PY" "$C" fill:100 stats free stats
        expect_done
        expect_count "^alloc 100 ok$" 10
        expect_line "^alloc 100 err OutOfMemoryError$"
        expect_err "^gpucap: refused cuMemCreate of .* MiB on GPU 0"
        expect_line "^freed allocated=0 reserved=0$"
        expect_stats "d[0]['peak_used'] <= 1 << 30 and d[0]['final_used'] == 0"
        verdict "expandable_segments:True (cuMemCreate/cuMemMap) counted, refused at the cap, given back at empty_cache"

        run torch-expandable-threads LD_PRELOAD="$SHIM" GPUCAP_LIMIT=1Gi FAKECUDA_TOTAL_MEM=4Gi \
            PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- "$PY" "$C" meminfo threads:256x8 stats
        expect_done
        expect_line "^thread alloc 256 ok$"
        expect_line "^thread alloc 256 err OutOfMemoryError$"
        expect_err "^gpucap: refused cuMemCreate of .* MiB on GPU 0"
        expect_stats "d[0]['peak_used'] <= 1 << 30"
        verdict "expandable_segments:True from a loader's worker threads (no current context) refused at the cap"

        run torch-async LD_PRELOAD="$SHIM" GPUCAP_LIMIT=1Gi FAKECUDA_TOTAL_MEM=4Gi \
            PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync -- "$PY" "$C" fill:100 stats free stats
        expect_done
        expect_line "backend=cudaMallocAsync"
        expect_count "^alloc 100 ok$" 10
        expect_line "^alloc 100 err OutOfMemoryError$"
        expect_err "^gpucap: refused cuMemAllocAsync of 100 MiB on GPU 0"
        expect_stats "d[0]['peak_used'] <= 1 << 30 and d[0]['final_used'] == 0"
        verdict "backend:cudaMallocAsync (stream-ordered pool) counted, refused at the cap, released at empty_cache"

        run torch-growth FAKECUDA_TOTAL_MEM=4Gi -- "$GPUCAP" run --growth --limit 1Gi -- "$PY" "$C" fill:100 free meminfo fill:100
        expect_done
        expect_count "^alloc 100 ok$" 20
        expect_line "^mem_get_info free=$GIB total=$GIB$"
        expect_stats "d[0]['final_used'] == 1000 << 20 and d[0]['alloc_calls'] == 500 and d[0]['peak_used'] <= 1 << 30"
        verdict "gpucap run --growth: empty_cache does not give memory back to the GPU (footprint kept, second fill from it)"

        run torch-visible LD_PRELOAD="$SHIM" FAKECUDA_DEVICES=3 FAKECUDA_TOTAL_MEM=2Gi CUDA_VISIBLE_DEVICES=2,0 \
            GPUCAP_LIMIT=0=300MiB,1=500MiB -- "$PY" "$C" info device:0 meminfo fill:100 device:1 meminfo fill:100
        expect_done
        expect_line "^available True count 2$"
        expect_line "^device 0 name=FakeCUDA_Device_2 total=$((300 * MIB)) "
        expect_line "^device 1 name=FakeCUDA_Device_0 total=$((500 * MIB)) "
        expect_line "^mem_get_info free=$((300 * MIB)) total=$((300 * MIB))$"
        expect_line "^mem_get_info free=$((500 * MIB)) total=$((500 * MIB))$"
        expect_count "^alloc 100 ok$" 8
        expect_stats "d[0]['physical'] == 2 and d[0]['peak_used'] == 300 << 20 and d[1]['peak_used'] == 500 << 20"
        verdict "per-GPU caps with CUDA_VISIBLE_DEVICES=2,0 (300 MiB and 500 MiB)"

        run torch-green-context LD_PRELOAD="$SHIM" GPUCAP_LIMIT=1Gi FAKECUDA_TOTAL_MEM=4Gi \
            FAKECUDA_GREEN_CTX_MEM=64Mi -- "$PY" "$C" green:16 fill:100
        expect_done
        expect_line "^green 16 ok sms=16$"
        expect_err "^gpucap: refused cuMemAlloc of 100 MiB on GPU 0"
        expect_stats "d[0]['peak_used'] <= 1 << 30"
        verdict "a green context of 16 SMs (torch.cuda.green_contexts, a stream of it): its own part (64 MiB on the fake) charged, the cap held"

        T=$ROOT/tests/clients/torch_steps.py
        run torch-train-step LD_PRELOAD="$SHIM" GPUCAP_LIMIT=3Gi FAKECUDA_TOTAL_MEM=8Gi -- "$PY" "$T" train 1 1 16 64
        expect_done
        expect_no_err "CUBLAS_STATUS|RuntimeError"
        expect_stats "d[0]['peak_used'] <= 3 << 30 and d[0]['alloc_calls'] > 0"
        verdict "a ResNet-18-like training step (cuDNN convolutions; the Linear head through cuBLAS, whose kernels are Zstandard-packed) under a 3 GiB cap"

        run torch-graph-step LD_PRELOAD="$SHIM" GPUCAP_LIMIT=3Gi FAKECUDA_TOTAL_MEM=8Gi -- "$PY" "$T" graph 1 1 16 64
        expect_done
        expect_no_err "CUDA Graph is empty|RuntimeError"
        expect_stats "d[0]['peak_used'] <= 3 << 30"
        verdict "torch.cuda.graph captures the net's kernels (not an empty graph) and replays under a 3 GiB cap"
    else
        failed=$((failed + 1))
        results+=("FAIL torch: could not install ${TORCH_SPEC[*]}")
    fi
fi

if [[ $want == *" jax "* ]]; then
    section "JAX (${JAX_SPEC[*]})"
    jax_probe="import jax, jax_plugins.xla_cuda13; print(jax.__version__)"
    if make_venv target/venv-jax "$jax_probe" "${JAX_SPEC[@]}"; then
        PY=$ROOT/target/venv-jax/bin/python
        C=$ROOT/tests/clients/jax_client.py
        echo "jax $($PY -c "$jax_probe")"
        J=(JAX_PLATFORMS=cuda)
        NS=(unshare -m --propagation private "$FAKEDEV")

        run jax-plain "${J[@]}" FAKECUDA_TOTAL_MEM=4Gi -- "${NS[@]}" "$PY" "$C" info copy:64 fill:256
        expect_done
        expect_line "^device 0 kind=FakeCUDA_Device_0 platform=gpu$"
        expect_line "^memory 0 limit=$((3 * GIB)) "
        expect_line "^copy 64 ok$"
        expect_line "^alloc 256 err .* RESOURCE_EXHAUSTED$"
        expect_stats "d[0]['peak_used'] >= 3 << 30"
        verdict "JAX's CUDA version checks (cuDNN, cuFFT, CUPTI, cuBLAS, cuSPARSE), jax.devices(), preallocation of 75% of the device, device_put until RESOURCE_EXHAUSTED, real bytes back"

        run jax-cap "${J[@]}" LD_PRELOAD="$SHIM" GPUCAP_LIMIT=1Gi FAKECUDA_TOTAL_MEM=4Gi -- "${NS[@]}" "$PY" "$C" info fill:100
        expect_done
        expect_line "^memory 0 limit=$((768 * MIB)) "
        expect_line "^alloc 100 err .* RESOURCE_EXHAUSTED$"
        expect_stats "d[0]['peak_used'] <= 1 << 30 and d[0]['peak_used'] >= 768 << 20"
        verdict "1 GiB cap: XLA preallocates 75% of the cap it is shown, refuses beyond it"

        run jax-fraction "${J[@]}" LD_PRELOAD="$SHIM" GPUCAP_LIMIT=1Gi XLA_PYTHON_CLIENT_MEM_FRACTION=.5 FAKECUDA_TOTAL_MEM=4Gi -- "${NS[@]}" "$PY" "$C" info
        expect_done
        expect_line "^memory 0 limit=$((512 * MIB)) "
        expect_stats "d[0]['peak_used'] <= 1 << 30"
        verdict "XLA_PYTHON_CLIENT_MEM_FRACTION=.5 is of the cap"

        run jax-noprealloc "${J[@]}" LD_PRELOAD="$SHIM" GPUCAP_LIMIT=1Gi XLA_PYTHON_CLIENT_PREALLOCATE=false \
            XLA_PYTHON_CLIENT_MEM_FRACTION=1.0 FAKECUDA_TOTAL_MEM=4Gi -- "${NS[@]}" "$PY" "$C" info fill:100
        expect_done
        expect_line "^alloc 100 err .* RESOURCE_EXHAUSTED$"
        expect_err "^gpucap: refused cuMem(Alloc|Create) of .* on GPU 0"
        expect_stats "d[0]['peak_used'] <= 1 << 30"
        verdict "XLA_PYTHON_CLIENT_PREALLOCATE=false: allocations (VMM: cuMemCreate) grow until gpucap refuses at the cap"

        run jax-fraction-cap "${J[@]}" LD_PRELOAD="$SHIM" GPUCAP_LIMIT=25% FAKECUDA_TOTAL_MEM=4Gi -- "${NS[@]}" "$PY" "$C" info fill:100
        expect_done
        expect_line "^memory 0 limit=$((768 * MIB)) "
        expect_line "^alloc 100 err .* RESOURCE_EXHAUSTED$"
        expect_stats "d[0]['peak_used'] <= 1 << 30 and d[0]['peak_used'] >= 768 << 20"
        verdict "a fraction cap (GPUCAP_LIMIT=25% of 4 GiB): XLA preallocates 75% of the 1 GiB it is shown"

        run jax-growth "${J[@]}" FAKECUDA_TOTAL_MEM=4Gi -- "${NS[@]}" "$GPUCAP" run --growth --limit 1Gi -- "$PY" "$C" info fill:100
        expect_done
        expect_line "^memory 0 limit=$((768 * MIB)) "
        expect_line "^alloc 100 err .* RESOURCE_EXHAUSTED$"
        expect_stats "d[0]['peak_used'] <= 1 << 30 and d[0]['peak_used'] >= 768 << 20"
        verdict "gpucap run --growth --limit 1Gi: XLA starts and preallocates 75% of the cap in growth mode, the cap holds"

        run jax-visible "${J[@]}" LD_PRELOAD="$SHIM" FAKECUDA_DEVICES=2 FAKECUDA_TOTAL_MEM=2Gi CUDA_VISIBLE_DEVICES=1,0 \
            GPUCAP_LIMIT=0=400MiB,1=800MiB -- "${NS[@]}" "$PY" "$C" info
        expect_done
        expect_line "^device 0 kind=FakeCUDA_Device_1 platform=gpu$"
        expect_line "^device 1 kind=FakeCUDA_Device_0 platform=gpu$"
        expect_line "^memory 0 limit=$((300 * MIB)) "
        expect_line "^memory 1 limit=$((600 * MIB)) "
        expect_stats "d[0]['peak_used'] <= 400 << 20 and d[1]['peak_used'] <= 800 << 20"
        verdict "per-GPU caps with CUDA_VISIBLE_DEVICES=1,0 (XLA takes 75% of each cap)"
    else
        failed=$((failed + 1))
        results+=("FAIL jax: could not install ${JAX_SPEC[*]}")
    fi
fi

if [[ $want == *" tf "* ]]; then
    section "TensorFlow (${TF_SPEC[*]})"
    tf_probe="import tensorflow as tf; assert tf.test.is_built_with_cuda(); print(tf.__version__)"
    if make_venv target/venv-tf "$tf_probe" "${TF_SPEC[@]}"; then
        PY=$ROOT/target/venv-tf/bin/python
        C=$ROOT/tests/clients/tf_client.py
        echo "tensorflow $(TF_CPP_MIN_LOG_LEVEL=3 $PY -c "$tf_probe" 2>/dev/null)"
        # TensorFlow 2.21's libtensorflow_framework.so.2 has every nvidia/*/lib of its wheels
        # in its RUNPATH but cuSOLVER's, so its dlopen of libcusolver.so.11 fails and it
        # registers no GPU ("Cannot dlopen some GPU libraries"), on any machine; the wheel's
        # directory goes on the library path. TensorFlow needs no /dev/nvidiactl.
        CUSOLVER=$($PY -c "import nvidia.cusolver as m; print(list(m.__path__)[0] + '/lib')")
        # TensorFlow's start-up log (level 0) says what device memory it took.
        T=(LD_LIBRARY_PATH="$FAKE:$CUSOLVER" TF_CPP_MIN_LOG_LEVEL=0)

        # TensorFlow keeps back 1800 MiB of a device of compute capability 9 (225 MiB of one
        # under 2 GiB) from the free memory it is shown (its MinSystemMemory). Under CUDA's
        # lazy loading, which the fake answers (cuModuleGetLoadingMode), cudart loads no
        # module before TensorFlow asks (told eager, it had loaded a 4-byte global).
        run tf-plain "${T[@]}" FAKECUDA_TOTAL_MEM=4Gi -- "$PY" "$C" info devices meminfo copy:64 fill:256 meminfo kernel
        expect_done
        expect_line "^gpus 1$"
        expect_line "^gpu 0 name=FakeCUDA_Device_0 cc=9.0$"
        expect_line "^device /device:GPU:0 memory_limit=$((4 * GIB - 1800 * MIB))$"
        expect_err "Created device /job:localhost/replica:0/task:0/device:GPU:0 with 2296 MB memory"
        expect_line "^memory_info current=0 peak=0$"
        expect_line "^copy 64 ok device:GPU:0$"
        expect_count "^alloc 256 ok$" 8
        expect_line "^alloc 256 err ResourceExhaustedError$"
        expect_line "^kernel ok device:GPU:0$"
        expect_stats "d[0]['peak_used'] >= (4 << 30) - (1800 << 20) and d[0]['peak_used'] < 2400 << 20 and d[0]['alloc_calls'] <= 3"
        verdict "list_physical_devices, device details, BFC takes 4 GiB less 1800 MiB at its first allocation (one cuMemAlloc), tf.zeros on GPU:0 until ResourceExhaustedError, real bytes to the device and back, an op launched (no-op)"

        run tf-growth "${T[@]}" FAKECUDA_TOTAL_MEM=4Gi -- "$PY" "$C" growth devices fill:256 meminfo
        expect_done
        expect_count "^alloc 256 ok$" 8
        expect_line "^alloc 256 err ResourceExhaustedError$"
        expect_stats "d[0]['alloc_calls'] >= 4 and d[0]['peak_used'] < (4 << 30) - (1800 << 20) - 4096"
        verdict "set_memory_growth: BFC grows in several cuMemAlloc regions, not one grab"

        run tf-env-growth "${T[@]}" FAKECUDA_TOTAL_MEM=4Gi TF_FORCE_GPU_ALLOW_GROWTH=true -- "$PY" "$C" devices copy:16 meminfo
        expect_done
        expect_line "^copy 16 ok device:GPU:0$"
        expect_stats "d[0]['peak_used'] < 64 << 20"
        verdict "TF_FORCE_GPU_ALLOW_GROWTH=true: a 16 MiB copy takes under 64 MiB of the device"

        run tf-cap "${T[@]}" LD_PRELOAD="$SHIM" GPUCAP_LIMIT=1Gi FAKECUDA_TOTAL_MEM=4Gi -- "$PY" "$C" info devices fill:100 meminfo
        expect_done
        expect_line "^device /device:GPU:0 memory_limit=$((799 * MIB))$"
        expect_err "Created device /job:localhost/replica:0/task:0/device:GPU:0 with 799 MB memory"
        expect_count "^alloc 100 ok$" 7
        expect_line "^alloc 100 err ResourceExhaustedError$"
        expect_no_err "^gpucap: refused"
        expect_stats "d[0]['peak_used'] <= 1 << 30 and d[0]['peak_used'] >= 799 << 20"
        verdict "1 GiB cap: TensorFlow is shown 1 GiB and takes 1 GiB less 225 MiB at start, refuses beyond it itself; driver peak <= cap"

        run tf-cap-vlimit "${T[@]}" LD_PRELOAD="$SHIM" GPUCAP_LIMIT=1Gi FAKECUDA_TOTAL_MEM=4Gi -- "$PY" "$C" vlimit:2048 devices fill:100 meminfo
        expect_done
        expect_line "^device /device:GPU:0 memory_limit=$((2 * GIB))$"
        expect_count "^alloc 100 ok$" 9
        expect_line "^alloc 100 err ResourceExhaustedError$"
        expect_err "^gpucap: refused cuMemAlloc of .* on GPU 0: 0 B of the 1 GiB cap in use$"
        expect_err "^gpucap: refused cuMemAlloc of .* on GPU 0: [0-9.]+ MiB of the 1 GiB cap in use$"
        # Dozens of refusals, the BFC allocator backing off by tenths: a line per run of
        # them, and one more a second later (3 seen; 99 before gpucap folded back-offs).
        expect_err_at_most "^gpucap: refused " 6
        expect_stats "d[0]['peak_used'] <= 1 << 30"
        verdict "a 2 GiB logical device under a 1 GiB cap: gpucap refuses the 2 GiB region, BFC backs off to what fits, the fill ends in ResourceExhaustedError at the cap; a line per back-off, not per refusal"

        run tf-async "${T[@]}" LD_PRELOAD="$SHIM" GPUCAP_LIMIT=1Gi FAKECUDA_TOTAL_MEM=4Gi TF_GPU_ALLOCATOR=cuda_malloc_async -- "$PY" "$C" devices fill:100 free meminfo
        expect_done
        expect_count "^alloc 100 ok$" 10
        expect_line "^alloc 100 err ResourceExhaustedError$"
        expect_err "^gpucap: refused cuMemAllocFromPoolAsync of 100 MiB on GPU 0: 1002 MiB of the 1 GiB cap in use$"
        expect_stats "d[0]['peak_used'] <= 1 << 30"
        verdict "TF_GPU_ALLOCATOR=cuda_malloc_async (stream-ordered pool) counted, refused at the cap"

        run tf-growth-mode "${T[@]}" FAKECUDA_TOTAL_MEM=4Gi -- "$GPUCAP" run --growth --limit 1Gi -- "$PY" "$C" devices fill:100 free fill:100
        expect_done
        expect_err "TF_FORCE_GPU_ALLOW_GROWTH environment variable is set"
        expect_line "^device /device:GPU:0 memory_limit=$((799 * MIB))$"
        expect_count "^alloc 100 ok$" 12
        expect_count "^alloc 100 err ResourceExhaustedError$" 2
        expect_stats "d[0]['peak_used'] <= 1 << 30 and d[0]['alloc_calls'] >= 100"
        verdict "gpucap run --growth --limit 1Gi: TensorFlow grows (gpucap set TF_FORCE_GPU_ALLOW_GROWTH), its regions are served as 2 MiB pages, the second fill is served again under the cap"

        run tf-fit "${T[@]}" LD_PRELOAD="$SHIM" GPUCAP_LIMIT=1Gi FAKECUDA_TOTAL_MEM=4Gi -- "$PY" "$C" fit:32 meminfo
        expect_done
        expect_line "^fit 32 ok device:GPU:0$"
        expect_no_err "^gpucap: refused"
        expect_stats "d[0]['peak_used'] <= 1 << 30 and d[0]['alloc_calls'] > 100"
        verdict "Keras fit of a small convolutional net (jit_compile=False: TensorFlow's kernels, cuDNN, cuBLAS) under a 1 GiB cap"

        # XLA's command buffers are CUDA graphs built node by node (kernel and memcpy nodes)
        # and updated between launches.
        run tf-fit-xla "${T[@]}" LD_PRELOAD="$SHIM" GPUCAP_LIMIT=3Gi FAKECUDA_TOTAL_MEM=8Gi -- "$PY" "$C" fit:32:xla meminfo
        expect_done
        expect_line "^fit 32 ok device:GPU:0$"
        expect_stats "d[0]['peak_used'] <= 3 << 30"
        verdict "the same fit jit-compiled by XLA (Keras's default on a GPU), its command buffers CUDA graphs, under a 3 GiB cap"

        run tf-visible "${T[@]}" LD_PRELOAD="$SHIM" FAKECUDA_DEVICES=2 FAKECUDA_TOTAL_MEM=2Gi CUDA_VISIBLE_DEVICES=1,0 \
            GPUCAP_LIMIT=0=400MiB,1=800MiB -- "$PY" "$C" info devices fill:100
        expect_done
        expect_line "^gpu 0 name=FakeCUDA_Device_1 cc=9.0$"
        expect_line "^gpu 1 name=FakeCUDA_Device_0 cc=9.0$"
        expect_line "^device /device:GPU:0 memory_limit=$((175 * MIB))$"
        expect_line "^device /device:GPU:1 memory_limit=$((575 * MIB))$"
        expect_count "^alloc 100 ok$" 1
        expect_stats "d[0]['physical'] == 1 and d[0]['peak_used'] <= 400 << 20 and d[1]['peak_used'] <= 800 << 20"
        verdict "per-GPU caps with CUDA_VISIBLE_DEVICES=1,0 (each cap less TensorFlow's 225 MiB)"
    else
        failed=$((failed + 1))
        results+=("FAIL tf: could not install ${TF_SPEC[*]}")
    fi
fi

section "Summary"
printf '%s\n' "${results[@]}"
echo "frameworks: $passed passed, $failed failed"
[ "$failed" = 0 ]
