# Helpers shared by the benchmark scripts (sourced, not run): scripts/bench/bench-instructions.sh, scripts/bench/bench-breakdown.sh,
# scripts/bench/bench-hami.sh, scripts/gpu/probe-driver.sh.

# bench_clean_env [PATTERN]: unsets every GPUCAP_* and FAKECUDA_* variable of the caller's
# environment (and those whose names match the extended regex PATTERN, say
# 'CUDA_DEVICE_[A-Za-z0-9_]*'), and LD_PRELOAD: each way is measured with the variables
# the script gives it, not with what the shell had (the shim refuses a GPUCAP_ name it
# does not know, such as the test suite's GPUCAP_TEST_*).
bench_clean_env() {
    local pat='GPUCAP_[A-Za-z0-9_]*|FAKECUDA_[A-Za-z0-9_]*' v
    [ -z "${1:-}" ] || pat="$pat|$1"
    for v in $(env | sed -En "s/^($pat)=.*/\1/p"); do unset "$v"; done
    unset LD_PRELOAD
}

# bench_prepare NAME SHIM TOOL...: how each callgrind benchmark starts (NAME in its
# messages): every TOOL on PATH, SHIM and the fake libcuda.so built, a scratch folder
# $tmp removed at exit, a clean environment (bench_clean_env), the fake driver and
# bench_alloc (bench_fake_setup). Needs R.
bench_prepare() {
    local name=$1 shim=$2 t f
    shift 2
    for t in "$@"; do
        case $t in addr2line) f=binutils ;; *) f=$t ;; esac
        command -v "$t" >/dev/null || { echo "$name: $t not found (apt-get install $f)" >&2; exit 1; }
    done
    for f in "$shim" "$R/libcuda.so"; do
        [ -f "$f" ] || { echo "$name: $f missing: run cargo build --release" >&2; exit 1; }
    done
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    bench_clean_env
    bench_fake_setup
}

# bench_fixed_layout NAME SHIM [nvml]: a folder of a fixed length under /tmp ($lay,
# removed at exit with $tmp) holding the shim (libgpucap.so), the fake driver
# (libcuda.so.1, and libcuda.so for linking) and with "nvml" the fake NVML
# (libnvidia-ml.so.1, which the shim then loads to measure contexts), for callgrind counts
# that must not depend on where the checkout lies: the loader keeps each library's path
# in memory it allocates, and where that memory ends moves what the process allocates
# after it, and so the probes of tables keyed by what it allocated. Run the counted
# process from $lay with LD_LIBRARY_PATH=$lay. Needs R.
bench_fixed_layout() {
    lay=$(mktemp -d "/tmp/gpucap-$1.XXXXXXXX")
    trap 'rm -rf "${tmp:-}" "$lay"' EXIT
    cp "$2" "$lay/libgpucap.so"
    cp "$R/libcuda.so" "$lay/libcuda.so.1"
    ln -s libcuda.so.1 "$lay/libcuda.so"
    [ "${3:-}" != nvml ] || cp "$R/libnvidia_ml.so" "$lay/libnvidia-ml.so.1"
}

# bench_fake_setup [nvml]: the fake driver's links in $FAKEDIR (default
# $R/fakecuda; with "nvml", the fake NVML beside it) and BIN, bench_alloc
# built against it. Needs R (target/release).
bench_fake_setup() {
    FAKEDIR=${FAKEDIR:-$R/fakecuda}
    mkdir -p "$FAKEDIR" "$R/ctests"
    ln -sf "$R/libcuda.so" "$FAKEDIR/libcuda.so.1"
    ln -sf "$R/libcuda.so" "$FAKEDIR/libcuda.so"
    [ "${1:-}" = nvml ] && ln -sf "$R/libnvidia_ml.so" "$FAKEDIR/libnvidia-ml.so.1"
    # Built into this run's own folder: two runs at once (the test suite's benchmark
    # tests) must not write over the binary the other is running.
    BIN=${tmp:-$R/ctests}/bench_alloc_ir
    cc -O2 -pthread -o "$BIN" tests/c/bench_alloc.c -Itests/c -L"$FAKEDIR" -lcuda
}

# cuda_link_dir DIR: DIR/libcuda.so -> the libcuda.so.1 the loader would take
# (LD_LIBRARY_PATH first, then ldconfig's cache), so `cc -L DIR -lcuda` links to the
# driver of this machine, real or fake. Fails with a message when there is none.
cuda_link_dir() {
    local driver='' d dirs
    IFS=: read -r -a dirs <<<"${LD_LIBRARY_PATH:-}"
    for d in ${dirs[@]+"${dirs[@]}"}; do
        [ -e "$d/libcuda.so.1" ] && { driver=$d/libcuda.so.1; break; }
    done
    [ -n "$driver" ] || driver=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / { print $NF; exit }')
    [ -n "$driver" ] || { echo "no libcuda.so.1 found (LD_LIBRARY_PATH, ldconfig)" >&2; return 1; }
    mkdir -p "$1"
    ln -sfn "$driver" "$1/libcuda.so"
    echo "$driver"
}

# bench_netns NAME: sets NETNS, the command that runs a counted run in a network namespace
# of its own. The member that makes a pool file reads the machine's Unix sockets first
# (/proc/net/unix, some 400 instructions a socket: src/pool-file/beacon.rs), which other
# processes open and close meanwhile: counted beside the test suite, a pool run's total
# moved by up to 26,000 (a pair's figure by 20 and more at N=200). As root where it may
# (a container without CAP_SYS_ADMIN may still map its user).
bench_netns() {
    NETNS=(unshare --net)
    if ! "${NETNS[@]}" true 2>/dev/null; then
        NETNS=(unshare --map-root-user --net)
        "${NETNS[@]}" true || {
            echo "gpucap $1: cannot make a network namespace (unshare --net, unshare --map-root-user --net): the count would depend on the machine's sockets" >&2
            exit 1
        }
    fi
}

# instructions PRELOAD PAIRS LIVE [VAR=VALUE...]: total instructions (Ir) of one run of
# $BIN under callgrind, pairs of BSIZE bytes (default 4Ki) (THREADS=k among the
# variables: k threads of PAIRS pairs each). `@RUN@` in a value becomes a name of this
# run's own (GPUCAP_POOL=bench-@RUN@: each run makes its pool, so that the N and 2N runs
# start alike; joining the file the other run left, with its dead member to take back,
# is other work than making it), and the files named so in $tmp are removed after it.
# Needs FAKEDIR, BIN and tmp; in NETNS where it is set (bench_netns).
instructions() {
    local preload=$1 pairs=$2 live=$3 out=$tmp/cg.$RANDOM size=${BSIZE:-4Ki} threads=1 mode=pair vars=()
    local run=run$RANDOM$RANDOM
    shift 3
    for v in "$@"; do
        case $v in THREADS=*) threads=${v#THREADS=} ;; MODE=*) mode=${v#MODE=} ;; *) vars+=("${v//@RUN@/$run}") ;; esac
    done
    ${NETNS[@]+"${NETNS[@]}"} env LD_LIBRARY_PATH="$FAKEDIR" FAKECUDA_TOTAL_MEM=80Gi GPUCAP_LIMIT=40Gi ${vars[@]+"${vars[@]}"} \
        ${preload:+LD_PRELOAD=$preload} \
        valgrind --tool=callgrind --callgrind-out-file="$out" "$BIN" "$threads" "$pairs" "$size" "$mode" "live=$live" >/dev/null 2>&1 ||
        { echo "bench: bench_alloc $threads $pairs $size $mode live=$live $* failed" >&2; exit 1; }
    awk '/^summary:/ {print $2}' "$out"
    rm -f "$out"
    # What a run of its own made goes with it: the next run finds what this one found.
    case "$*" in *@RUN@*) rm -f "$tmp"/*"$run"* "$tmp"/gpucap-*/*"$run"* ;; esac
}

# per_pair PRELOAD LIVE [VAR=VALUE...]: instructions of one pair (N vs 2N pairs, N=$N).
per_pair() {
    local preload=$1 live=$2 a b
    shift 2
    a=$(instructions "$preload" "$N" "$live" "$@")
    b=$(instructions "$preload" $((2 * N)) "$live" "$@")
    echo $(((b - a) / N))
}

# whole_instructions VAR=VALUE... -- CMD...: callgrind's total for one run of CMD (in
# NETNS where it is set).
whole_instructions() {
    local vars=() out=$tmp/cgw.$RANDOM
    while [ "$1" != -- ]; do vars+=("$1"); shift; done
    shift
    ${NETNS[@]+"${NETNS[@]}"} env ${vars[@]+"${vars[@]}"} valgrind --tool=callgrind --callgrind-out-file="$out" "$@" >/dev/null 2>"$out.log" ||
        { echo "bench: $* failed under valgrind" >&2; cat "$out.log" >&2; exit 1; }
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out.log"
    rm -f "$out" "$out.log"
}

# med NUMBERS...: the median.
med() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
