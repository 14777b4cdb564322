#!/usr/bin/env bash
# The whole real-GPU proof in one command, for a machine lent for minutes: every check of
# scripts/gpu-check.sh, the benchmarks, the first use of CUDA, and the hooks of the
# driver-answers probe and HAMi-core's benchmark, within one time budget, packed into a
# few files. Needs no Rust and no network: the release build is made beforehand.
#
#   scripts/gpu-run.sh OUTDIR [options]
#
#   --lib PATH      libgpucap.so  (default target/release/libgpucap.so)
#   --cli PATH      gpucap        (default target/release/gpucap)
#   --python PATH   the Python with torch / jax / cupy / numba (default python3)
#   --budget S      the time budget of the whole run, in seconds (default 460, at least
#                   30). A part that would start too late is SKIPped, a part running
#                   late is stopped (FAIL); the packing (10 s kept for it) always runs.
#   --reps N        benchmark repetitions (default 3); --target-ms MS (default 200)
#   --train-reps N  training benchmark runs per mode (default 4); --train-steps N (100)
#   --first-reps N  first-use runs per way (default 5)
#   --probe-driver PATH, --bench-hami PATH   the hooks (default scripts/gpu/probe-driver.sh,
#                   scripts/gpu/bench-hami-hook.sh; a hook that is not there is SKIPped)
#   --parts LIST    run only these parts (comma-separated; env and the packing always
#                   run): a rerun of what failed, say `--parts checks --only 'pool'`.
#                   Two sets for a GPU lent for two commands: `--parts first` (the step
#                   cost, the new checks, the re-checks, probe-driver, diag) and `--parts rest`
#                   (checks, bench, bench-hami, first-use; the checks part then leaves out
#                   what `first` ran); see docs/src/real-gpu.md
#   --only REGEX    the checks part runs only the checks whose name matches (gpu-check.sh)
#   --pool-members N  processes of the pool-64 check (default 64)
#   --step-rounds N   rounds of the step-cost benchmark (default 8)
#
# Parts, in order (the step cost and the new checks first), each with its seconds
# printed: env (what the machine is); step-cost (gpu-check.sh --bench --only bench-step:
# raw, gpucap, a pool and HAMi-core where carried, 8 rotating rounds, into
# step-cost.json); graphs, nccl, vllm-sizing, pool-64, kill-storm (those checks of
# gpu-check.sh, one part each); recheck (pool-contexts and accounting-jax, the checks the
# last run asked to repeat); probe-driver (scripts/gpu/probe-driver.sh
# DIR, where it exists: writes DIR/driver-answers.json); diag (the diagnostics of
# scripts/gpu/diag/ that wait for a GPU, raw and under gpucap: heap-when (and --graph),
# fork-hold, capture-lazy; their output in logs.tar.gz); checks (every other check of
# gpu-check.sh: a check whose own part is asked for is left to it); bench (gpu-check.sh
# --bench); bench-hami (scripts/gpu/bench-hami-hook.sh
# DIR: scripts/bench/bench-hami.sh on the HAMi-core build carried in target/hami, into
# DIR/hami.json; SKIP without that build), first-use (cuInit, first context, first
# allocation, raw and under gpucap). The hooks get GPUCAP_LIB, GPU_RUN_CLI and
# GPU_RUN_DEADLINE (seconds since the epoch by which they must be done) in their
# environment (GPU_RUN_CLI, not GPUCAP_CLI: the shim refuses a GPUCAP_ name it does not
# know, and the hooks' capped children inherit it).
#
# OUTDIR gets at most 8 files: summary.txt, results.json (parts, checks, seconds,
# figures, the step cost's ratios), logs.tar.gz (every log), step-cost.json,
# gpu-bench.json, first-use.json, and from the hooks driver-answers.json and hami.json. Exit status 1 if any check or part failed,
# 0 otherwise (a SKIP is not a failure), 2 for a bad command line.
set -uo pipefail

ORIG_PWD=$PWD
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT=$PWD
T0=$(date +%s)

die_usage() {
    printf 'gpu-run.sh: %s (see --help)\n' "$1" >&2
    exit 2
}
abspath() { case $1 in /*) printf '%s' "$1" ;; *) printf '%s/%s' "$ORIG_PWD" "$1" ;; esac; }
uint_at_least() { # OPTION VALUE MIN
    if ! [[ $2 =~ ^[0-9]+$ ]] || [ "$2" -lt "$3" ]; then
        die_usage "$1 wants a whole number, at least $3"
    fi
    printf '%s' "$2"
}

OUTDIR='' LIB=$ROOT/target/release/libgpucap.so CLI=$ROOT/target/release/gpucap PY=python3
BUDGET=460 REPS=3 TARGET_MS=200 TRAIN_REPS=4 TRAIN_STEPS=100 FIRST_REPS=5
PROBE_DRIVER=$ROOT/scripts/gpu/probe-driver.sh BENCH_HAMI=$ROOT/scripts/gpu/bench-hami-hook.sh
FIRST_PARTS=step-cost,graphs,nccl,vllm-sizing,pool-64,kill-storm,recheck,probe-driver,diag
REST_PARTS=checks,bench,bench-hami,first-use
ALL_PARTS=env,$FIRST_PARTS,$REST_PARTS PARTS_WANTED=$ALL_PARTS ONLY= POOL_MEMBERS=64 STEP_ROUNDS=8 REST_ALIAS=0
while [ $# -gt 0 ]; do
    opt=$1
    case $opt in
        -h | --help) sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        --*=*) val=${opt#*=}; opt=${opt%%=*}; shift ;;
        --lib | --cli | --python | --budget | --reps | --target-ms | --train-reps | --train-steps | --first-reps | \
            --probe-driver | --bench-hami | --parts | --only | --pool-members | --step-rounds)
            [ $# -ge 2 ] || die_usage "$opt needs a value"
            val=$2; shift 2 ;;
        -*) die_usage "unknown option '$opt'" ;;
        *)
            [ -z "$OUTDIR" ] || die_usage "unexpected argument '$opt' (OUTDIR is '$OUTDIR')"
            OUTDIR=$(abspath "$opt"); shift; continue ;;
    esac
    case $opt in
        --lib) LIB=$(abspath "$val") ;;
        --cli) CLI=$(abspath "$val") ;;
        --python) case $val in */*) PY=$(abspath "$val") ;; *) PY=$val ;; esac ;;
        --budget) BUDGET=$(uint_at_least "$opt" "$val" 30) || exit 2 ;;
        --probe-driver) PROBE_DRIVER=$(abspath "$val") ;;
        --bench-hami) BENCH_HAMI=$(abspath "$val") ;;
        --parts)
            IFS=, read -ra want <<<"$val"
            val=
            for p in "${want[@]}"; do
                case $p in first) p=$FIRST_PARTS ;; rest) p=$REST_PARTS REST_ALIAS=1 ;; esac
                val+=${val:+,}$p
            done
            IFS=, read -ra want <<<"$val"
            for p in "${want[@]}"; do
                [[ ,$ALL_PARTS, == *,"$p",* ]] || die_usage "--parts: no part '$p' (the parts: $ALL_PARTS)"
            done
            PARTS_WANTED=env,$val ;;
        --only) ONLY=$val ;;
        --pool-members) POOL_MEMBERS=$(uint_at_least "$opt" "$val" 2) || exit 2 ;;
        --step-rounds) STEP_ROUNDS=$(uint_at_least "$opt" "$val" 3) || exit 2 ;;
        --reps) REPS=$(uint_at_least "$opt" "$val" 1) || exit 2 ;;
        --target-ms) TARGET_MS=$(uint_at_least "$opt" "$val" 10) || exit 2 ;;
        --train-reps) TRAIN_REPS=$(uint_at_least "$opt" "$val" 1) || exit 2 ;;
        --train-steps) TRAIN_STEPS=$(uint_at_least "$opt" "$val" 1) || exit 2 ;;
        --first-reps) FIRST_REPS=$(uint_at_least "$opt" "$val" 1) || exit 2 ;;
        *) die_usage "unknown option '$opt'" ;;
    esac
done
[ -n "$OUTDIR" ] || die_usage "give OUTDIR, the folder for the results"
mkdir -p "$OUTDIR" || die_usage "cannot create $OUTDIR"
if [ -n "$(ls -A "$OUTDIR")" ]; then
    die_usage "$OUTDIR is not empty: give a new or empty folder (at most 8 files come back)"
fi
END=$((T0 + BUDGET))
PACK_RESERVE=10 # seconds kept for packing

W=$(mktemp -d "${TMPDIR:-/tmp}/gpu-run.XXXXXX") || exit 2
trap 'rm -rf "$W"' EXIT
PARTS=$W/parts.tsv
: >"$PARTS"
FAILED=0

# part NAME MAX_S MIN_S CMD...: runs CMD (output to W/NAME.log, echoed) for at most
# MAX_S seconds and never past the budget; SKIP when fewer than MIN_S seconds are left.
# CMD sees PART_DEADLINE (seconds since the epoch). Status: PASS (0), SKIP (77), FAIL.
part() {
    local name=$1 max=$2 min=$3 now left limit rc status detail t
    shift 3
    if [[ ,$PARTS_WANTED, != *,"$name",* ]]; then
        printf '%s\tSKIP\t0\tnot asked for (--parts %s)\n' "$name" "${PARTS_WANTED#env,}" >>"$PARTS"
        return
    fi
    now=$(date +%s)
    left=$((END - PACK_RESERVE - now))
    if [ "$left" -lt "$min" ]; then
        printf '%s\tSKIP\t0\tthe time budget is spent (%ds left of %ds, the part needs %ds)\n' \
            "$name" "$left" "$BUDGET" "$min" >>"$PARTS"
        printf '== %s: SKIP (time budget: %ds left)\n' "$name" "$left"
        return
    fi
    limit=$max
    [ "$left" -lt "$limit" ] && limit=$left
    printf '== %s (at most %ds; %ds into the run)\n' "$name" "$limit" $((now - T0))
    t=$SECONDS
    # its own process group (set -m), so that a part running late is stopped whole
    set -m
    (PART_DEADLINE=$((now + limit)) "$@") </dev/null > >(tee "$W/$name.log") 2>&1 &
    local pid=$! late=0
    set +m
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$(date +%s)" -ge $((now + limit)) ]; then
            late=1
            kill -TERM -- "-$pid" 2>/dev/null
            for _ in 1 2 3 4 5 6 7 8 9 10; do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.5
            done
            kill -KILL -- "-$pid" 2>/dev/null
            break
        fi
        sleep 0.2
    done
    wait "$pid"
    rc=$?
    [ "$late" = 1 ] && rc=124
    sleep 0.1 # tee's last lines
    t=$((SECONDS - t))
    case $rc in
        0) status=PASS detail= ;;
        77) status=SKIP detail=$(tail -n 1 "$W/$name.log") ;;
        124 | 137) status=FAIL detail="stopped after ${limit}s (its time limit)" ;;
        *) status=FAIL detail="exit status $rc: $(tail -n 1 "$W/$name.log")" ;;
    esac
    [ "$status" = FAIL ] && FAILED=1
    printf '%s\t%s\t%d\t%s\n' "$name" "$status" "$t" "${detail//$'\t'/ }" >>"$PARTS"
    printf '== %s: %s in %ds%s\n' "$name" "$status" "$t" "${detail:+ ($detail)}"
}

part_env() {
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
    echo "host: $(uname -srm), $(nproc) cores"
    echo "gpucap: $("$CLI" --version 2>&1 | head -n 1) ($CLI)"
    echo "shim: $LIB ($(stat -c %s "$LIB" 2>/dev/null) bytes)"
    echo "nvcc: $(nvcc --version 2>/dev/null | grep -i release || echo none)"
    echo "python: $("$PY" --version 2>&1)"
    "$PY" - <<'EOF' 2>&1
import importlib.metadata as m
for p in ("torch", "jax", "jaxlib", "cupy-cuda13x", "cupy-cuda12x", "numba-cuda", "cuda-bindings",
          "nvidia-ml-py"):
    try:
        print("  %s %s" % (p, m.version(p)))
    except m.PackageNotFoundError:
        pass
EOF
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "nvidia-smi: not found (no NVIDIA GPU here)"
        return 0
    fi
    nvidia-smi -L 2>&1
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,memory.used,mig.mode.current \
        --format=csv,noheader 2>&1
    [ -f "$LIB" ] && [ -x "$CLI" ]
}

# gpu-check.sh with the run's budget (GPU_CHECK_ARGS: the common options)
GPU_CHECK=("$ROOT/scripts/gpu-check.sh" --lib "$LIB" --cli "$CLI" --python "$PY" --timeout 120
    --pool-members "$POOL_MEMBERS" --step-rounds "$STEP_ROUNDS")
# The checks with a part of their own, by part: left out of the checks part when their
# part is asked for too, or with `--parts rest` (the first command ran them).
declare -A OWN=([graphs]='graphs|graphs-torch' [nccl]=nccl [vllm-sizing]=vllm-sizing [pool-64]=pool-64
    [kill-storm]=kill-storm [recheck]='pool-contexts|accounting-jax')
EXCEPT=
for p in "${!OWN[@]}"; do
    if [ "$REST_ALIAS" = 1 ] || [[ ,$PARTS_WANTED, == *,"$p",* ]]; then
        EXCEPT+="${EXCEPT:+|}${OWN[$p]}"
    fi
done
part_checks() {
    "${GPU_CHECK[@]}" --logs "$W/checks" --deadline "$PART_DEADLINE" ${ONLY:+--only "$ONLY"} \
        ${EXCEPT:+--except "^($EXCEPT)\$"}
}
# part_own NAME [TIMEOUT]: the checks of part NAME, in W/NAME
part_own() {
    "${GPU_CHECK[@]}" --logs "$W/$1" --deadline "$PART_DEADLINE" --only "^(${OWN[$1]})\$" ${2:+--timeout "$2"}
}
part_step_cost() {
    "${GPU_CHECK[@]}" --logs "$W/step-cost" --deadline "$PART_DEADLINE" --bench --only '^bench-step$' \
        --timeout 200 --out "$W/step-cost/gpu-bench.json" || return
    if grep -q '^PASS bench-step' "$W/step-cost/results.txt" && [ ! -s "$W/step-cost/step-cost.json" ]; then
        echo "bench-step passed but wrote no step-cost.json"
        return 1
    fi
}
part_bench() {
    "${GPU_CHECK[@]}" --logs "$W/bench" --deadline "$PART_DEADLINE" --bench --only '^bench-' --except '^bench-step$' \
        --out "$W/gpu-bench.json" --reps "$REPS" --target-ms "$TARGET_MS" \
        --train-reps "$TRAIN_REPS" --train-steps "$TRAIN_STEPS"
}

# hook SCRIPT FILE: SCRIPT DIR must write DIR/FILE; SKIP when the script is not there.
hook() {
    local script=$1 file=$2
    if [ ! -x "$script" ]; then
        echo "${script#"$ROOT"/} is not there (yet): nothing to run"
        return 77
    fi
    mkdir -p "$W/$file.d"
    GPUCAP_LIB=$LIB GPU_RUN_CLI=$CLI GPU_RUN_DEADLINE=$PART_DEADLINE "$script" "$W/$file.d" || return
    if [ ! -s "$W/$file.d/$file" ]; then
        echo "${script#"$ROOT"/} exited 0 but wrote no $file"
        return 1
    fi
}

# The diagnostics of scripts/gpu/diag/ that wait for a GPU: questions to the raw driver the
# fake cannot settle, each within its time limit, its output in W/diag/ (logs.tar.gz) and in
# the part's log: heap-when.py (which launch takes a raised malloc heap; with --graph,
# whether a graph's launch does), fork-hold.py (a
# killed or exiting process's memory while a child it forked lives), capture-lazy.py (when
# a kernel launched first inside a capture is loaded, which calls a capture forbids), raw
# and under gpucap. SKIP without nvidia-smi (no NVIDIA GPU), as the checks.
part_diag() {
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        echo "no NVIDIA GPU here (nvidia-smi not found): no diagnostic to run"
        return 77
    fi
    mkdir -p "$W/diag"
    local failed=()
    run_diag() { # NAME CMD...: the command's output in W/diag/NAME.txt, 60 s at most
        local name=$1 rc
        shift
        echo "-- diag $name: $*"
        timeout 60 "$@" </dev/null 2>&1 | tee "$W/diag/$name.txt"
        rc=${PIPESTATUS[0]}
        [ "$rc" = 0 ] || failed+=("$name (exit status $rc)")
    }
    run_diag heap-when "$PY" "$ROOT/scripts/gpu/diag/heap-when.py"
    run_diag heap-when-graph "$PY" "$ROOT/scripts/gpu/diag/heap-when.py" --graph
    run_diag fork-hold "$PY" "$ROOT/scripts/gpu/diag/fork-hold.py"
    run_diag capture-lazy "$PY" "$ROOT/scripts/gpu/diag/capture-lazy.py"
    run_diag capture-lazy-gpucap "$CLI" run --limit 50% -- "$PY" "$ROOT/scripts/gpu/diag/capture-lazy.py"
    if [ ${#failed[@]} -gt 0 ]; then
        echo "diagnostics that did not finish: ${failed[*]}"
        return 1
    fi
}

part_first_use() {
    "$PY" "$ROOT/scripts/gpu/first_use.py" --cli "$CLI" --reps "$FIRST_REPS" --out "$W/first-use.json" \
        --build "$W/first-use.d"
}

echo "gpu-run: budget ${BUDGET}s, results in $OUTDIR"
part env 20 5 part_env
if [ "$(awk -F'\t' '$1 == "env" { print $2 }' "$PARTS")" = FAIL ]; then
    echo "gpu-run: no shim or gpucap at $LIB / $CLI: nothing can be checked"
fi
# the step cost and the new checks first; what is left of the budget goes to the rest
part step-cost 200 60 part_step_cost
# (a gpu-check.sh part needs its set-up, a few seconds, and starts no check with less
# than 30 s left: 45 s at least)
part graphs 90 45 part_own graphs
part nccl 180 45 part_own nccl 180
part vllm-sizing 90 45 part_own vllm-sizing
part pool-64 120 45 part_own pool-64 120
part kill-storm 90 45 part_own kill-storm
part recheck 90 45 part_own recheck
part probe-driver 90 10 hook "$PROBE_DRIVER" driver-answers.json
part diag 150 20 part_diag
part checks 250 60 part_checks
part bench 180 30 part_bench
part bench-hami 90 20 hook "$BENCH_HAMI" hami.json
part first-use 20 10 part_first_use

# ---- pack ------------------------------------------------------------------------------
echo "== pack ($(($(date +%s) - T0))s into the run)"
for f in step-cost/step-cost.json gpu-bench.json first-use.json driver-answers.json.d/driver-answers.json \
    hami.json.d/hami.json; do
    [ -s "$W/$f" ] && cp "$W/$f" "$OUTDIR/"
done
if ! "$PY" "$ROOT/scripts/gpu/run_summary.py" --work "$W" --out "$OUTDIR" --budget "$BUDGET" \
    --started "$T0" --total $(($(date +%s) - T0)); then
    echo "gpu-run: writing summary.txt and results.json failed" | tee "$OUTDIR/summary.txt"
    FAILED=1
fi
# every log; not the programs the checks built (checks/build, bench/build, first-use.d)
tar -C "$W" -czf "$OUTDIR/logs.tar.gz" --exclude='./*/build' --exclude='./first-use.d' . 2>/dev/null ||
    echo "gpu-run: packing the logs failed"
n=$(find "$OUTDIR" -type f | wc -l)
echo "gpu-run: $n files in $OUTDIR, $(($(date +%s) - T0))s in all"
cat "$OUTDIR/summary.txt"
if grep -q '^FAIL ' "$OUTDIR/summary.txt"; then
    FAILED=1
fi
exit "$FAILED"
