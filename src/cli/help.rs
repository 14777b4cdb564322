//! The help texts of `gpucap` and its commands (`gpucap help [COMMAND]`, `--help`).

/// Which help text to show.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topic {
    General,
    Run,
    Check,
    Status,
    Top,
    Metrics,
    Jupyter,
    Cdi,
    Pool,
}

const GENERAL_HELP: &str = "\
gpucap: cap the GPU memory of unmodified CUDA programs.

usage: gpucap run [--limit SPEC] [--log LEVEL] [--growth] [--report PATH] [--pool NAME|PATH]
                  [--wait DURATION] [--guarantee SPEC] [--ceiling SPEC] [--quiet]
                  [--] CMD [ARGS...]
       gpucap run --measure [--log LEVEL] [--growth] [--] CMD [ARGS...]
       gpucap check [--limit SPEC] [--log LEVEL] [--growth] [--report PATH] [--pool NAME|PATH]
                    [--wait DURATION] [--guarantee SPEC] [--ceiling SPEC]
                    [--write-env FILE]
       gpucap status [--pool NAME|PATH | --all] [--json] [--uuid]
       gpucap status --prometheus [--pool NAME|PATH]... [--all] [--hami]
       gpucap top [--pool NAME|PATH] [--user NAME|UID] [--sort KEY] [--uuid]
                  [--interval SECS] [--iterations N | --once]
       gpucap metrics --listen ADDR:PORT [--pool NAME|PATH]... [--all] [--hami]
       gpucap jupyter install [--limit SPEC] [--pool NAME|PATH] [OPTIONS] (see help jupyter)
       gpucap jupyter list | remove NAME
       gpucap cdi generate --output FILE [--limit SPEC [--pool NAME|PATH|off]] [--name NAME]
                           [--kind VENDOR/CLASS] [--dir DIR] [--root DIR]
       gpucap pool list | gpucap pool clean [NAME]
       gpucap pool resize NAME|PATH|--claim DIR SIZE [--gpu N|UUID] [--dir DIR]
       gpucap pool set NAME|PATH|--claim DIR PID [--guarantee SIZE] [--ceiling SIZE|none]
                       [--gpu N|UUID] [--dir DIR]
       gpucap help [run|check|status|top|metrics|jupyter|cdi|pool]
       gpucap --version

commands:
  run     run CMD with libgpucap.so preloaded, so that its CUDA allocations are capped
          (--measure: run it uncapped and suggest a --limit from its peak)
  check   validate the configuration and show the cap of each visible GPU and the pool
  status  show every capped process once (pool members and processes capped alone),
          or one pool in detail (--json: as one JSON object; --prometheus: pools in
          Prometheus's text format)
  top     show every capped process, refreshed every second (Ctrl-C ends it)
  metrics serve pools to Prometheus over HTTP (GET /metrics), read at each scrape
  jupyter install a Jupyter kernel that starts under gpucap run (capped notebooks)
  cdi     write a CDI spec whose device caps a container (podman/docker run --device,
          containerd and CRI-O with CDI on): no entrypoint needed
  pool    list this user's pools (members alive and dead, bytes held, last use),
          remove those no process uses (clean), change a live pool's cap (resize) or
          a live member's guarantee and ceiling (set)
  help    show this help, or the help of a command

environment:
  GPUCAP_LIMIT          the cap: one value for every GPU, or a comma list (see below);
                        unset or none = allocations are counted, not capped (run says
                        so on stderr when unset; none is on purpose)
  GPUCAP_LOG            off, error, warn (default), info (adds a summary per GPU at
                        exit) or debug
  GPUCAP_LIB            the path of libgpucap.so (default: beside the gpucap executable,
                        else in the gpucap Python package that pip installed with it)
  GPUCAP_GROWTH         1/0, true/false, yes/no, on/off: growth-only mode (memory the
                        program frees stays with the process and serves it again)
  GPUCAP_REPORT         a file path: write a JSON usage report there at exit (%p = the
                        process id; without %p, processes add their entries to one file)
  GPUCAP_POOL           a name, an absolute file path, or off: the processes naming the
                        same pool share one budget per GPU (the container entrypoint
                        sets container-mntns, the container's pool, unless it is set);
                        unset or off = each process is capped alone
  GPUCAP_WAIT           with a pool: how long an allocation the pool cannot take now
                        waits for its members to free memory before it is refused:
                        0 (default: refused at once), or a whole number with ms, s,
                        m or h (30s, 5m), at most 24h; an error without a pool
  GPUCAP_GUARANTEE      in a pool: bytes the pool keeps for this process even before it
                        allocates them (SPEC as below; a share is of the pool's cap)
  GPUCAP_CEILING        in a pool: the most this process may hold (default: the cap)
  GPUCAP_POOL_DIR       an existing directory for named pools' files (default:
                        /dev/shm, else /tmp; a gpucap-UID
                        directory is made in it); one that does not exist is an error
  GPUCAP_CLAIM_DIR      the directory every container of one claim shares (read-write):
                        the pool's file is made in it (default: HAMi's DRA plugin's claim
                        directory, vgpu-manager's /etc/vgpu-manager/config)
  GPUCAP_LD_SO_PRELOAD  1/0...: the container entrypoint also installs libgpucap.so in
                        /etc/ld.so.preload
  GPUCAP_HOME           where the container entrypoint finds gpucap and libgpucap.so
  Any other GPUCAP_* variable is an error, to catch typos, and so is one of these in
  another case (gpucap_limit). A process whose environment
  has no GPUCAP_* variable at all reads gpucap.env beside libgpucap.so, else
  /etc/gpucap/gpucap.env (written by the container entrypoint); beside variables
  that are set, the file's cap and pool are a ceiling: they may lower the cap, never
  raise or remove it, nor leave the file's pool.

limit SPEC:
  8Gi, 512Mi, 4GiB, 1.5G, 100MB   a size (Ki Mi Gi Ti KiB... binary; k K M G T KB... decimal;
                                  units ending in B in any case: 8gb = 8GB = 7.45 GiB, said
                                  on a note line)
  1073741824                      whole bytes (without a unit: at least 1048576,
                                  so that 8 is not taken for 8 bytes)
  50%, 12.5%                      a share of the GPU's physical memory, in (0%, 100%]
                                  (below 1% gets a note line)
  0.5, 1.0                        the same as a fraction in (0, 1]
  0=8Gi,1=50%                     per GPU (CUDA ordinals, after CUDA_VISIBLE_DEVICES;
                                  each must be a GPU the process sees)
  4Gi,1=8Gi                       GPU 1 gets 8Gi, every other GPU 4Gi
  GPU-<uuid>=8Gi, MIG-<uuid>=4Gi  per GPU or MIG instance by UUID (nvidia-smi -L)

exit status: that of CMD for run; 2 for a usage or configuration error;
126 if CMD cannot be executed; 127 if CMD is not found; 1 for status and top when
the pool's file does not exist yet.";

const RUN_HELP: &str = "\
usage: gpucap run [--limit SPEC] [--log LEVEL] [--growth] [--report PATH] [--pool NAME|PATH]
                  [--wait DURATION] [--guarantee SPEC] [--ceiling SPEC] [--quiet]
                  [--] CMD [ARGS...]
       gpucap run --measure [--log LEVEL] [--growth] [--] CMD [ARGS...]

Runs CMD with libgpucap.so added to LD_PRELOAD, so that its CUDA allocations are
capped. gpucap replaces itself with CMD (exec): the exit status and signals are CMD's.

options:
  --limit SPEC   set GPUCAP_LIMIT (overrides the variable), e.g. 8Gi, 50%, 0=8Gi,1=50%;
                 none: no cap, on purpose (without any cap one line says CMD runs
                 uncapped)
  --quiet        no line saying that CMD runs with no cap
  --log LEVEL    set GPUCAP_LOG: off, error, warn, info or debug
  --growth       set GPUCAP_GROWTH=1 (growth-only mode), and, unless already set,
                 TF_FORCE_GPU_ALLOW_GROWTH=true and XLA_PYTHON_CLIENT_PREALLOCATE=false
                 so that TensorFlow and JAX grow on demand instead of preallocating
  --report PATH  set GPUCAP_REPORT: write a JSON usage report to PATH at exit (%p in
                 PATH = the process id); a relative PATH is made absolute here
  --pool NAME|PATH
                 set GPUCAP_POOL: CMD and every process that names the same pool share
                 one budget per GPU (each must set the same cap: another than the live
                 members' stops gpucap with exit status 2, CMD not run); off: no pool
  --wait DURATION
                 set GPUCAP_WAIT: with a pool, an allocation the pool cannot take now
                 waits up to DURATION (30s, 5m, ...; 0: refused at once) for members
                 to free memory; an error without a pool, as for the variable
  --guarantee SPEC
                 set GPUCAP_GUARANTEE: in the pool, bytes kept for CMD even before it
                 allocates them (4Gi, 25% of the pool's cap, 0=4Gi,1=2Gi); CMD is
                 refused at cuInit if the live members' guarantees leave no room
  --ceiling SPEC set GPUCAP_CEILING: the most CMD may hold of the pool (default: the cap)
  --measure      run CMD without a cap (no --limit, no GPUCAP_LIMIT) as a child, wait
                 for it, then print the peak of each GPU and a suggested --limit: the
                 peak plus 20%, rounded up to a quarter of its power of two (at least
                 1Mi). Exits with CMD's status (128+N if killed by signal N). While
                 waiting, Ctrl-C and Ctrl-\\ reach CMD only; SIGTERM and SIGHUP are
                 passed on to it. CMD is measured alone: not with --pool or GPUCAP_POOL.
  -h, --help     show this help
  --             end of options; everything after it is CMD and its arguments

The whole GPUCAP_* environment is validated before CMD starts: an error stops
gpucap with exit status 2, and CMD never runs uncapped by mistake. GPUs that
GPUCAP_LIMIT names must be ones the driver shows (checked when it can be loaded).
Without a loadable libcuda.so.1, one line says so (and points to README.md,
\"Without a GPU\", for gpucap's fake GPU); CMD then runs all the same.
libgpucap.so is taken from GPUCAP_LIB if set, else from the directory of the gpucap
executable; it is appended to an existing LD_PRELOAD (unless already there).
exit status: CMD's; 2 for a usage or configuration error; 126 if CMD cannot be
executed; 127 if CMD is not found.";

const CHECK_HELP: &str = "\
usage: gpucap check [--limit SPEC] [--log LEVEL] [--growth] [--report PATH] [--pool NAME|PATH]
                    [--wait DURATION] [--guarantee SPEC] [--ceiling SPEC]
                    [--write-env FILE]

Validates the GPUCAP_* environment (with the flags applied, as run would) and prints
the effective configuration and the library that run would preload. If a CUDA driver
can be loaded, it also prints the cap in bytes of each visible GPU, and a GPU named in
GPUCAP_LIMIT that the driver does not show is an error (exit status 2); if not, one
line says so. When the
environment has no GPUCAP_* variable, it checks the gpucap.env file the shim would
read instead (beside libgpucap.so, else /etc/gpucap/gpucap.env), if there is one;
when it has some, it shows the file's cap as the ceiling, what the environment asked
and, per GPU, the cap that holds.
With a pool (GPUCAP_POOL), it prints the pool's file and, if it exists, how many of
its members are alive; a pool directory that others could write in, or a pool file
that cannot be read as one, is an error (exit status 2), and so are a GPUCAP_POOL_DIR
that does not exist and a cap other than the one the pool's live members hold. A
gpucap-UID directory or pool file that does not exist yet is fine: the first process
that uses CUDA makes it.

options:
  --limit SPEC       check this GPUCAP_LIMIT instead of the variable's
  --log LEVEL        check this GPUCAP_LOG instead of the variable's
  --growth           check with GPUCAP_GROWTH=1
  --report PATH      check with this GPUCAP_REPORT
  --pool NAME|PATH   check with this GPUCAP_POOL
  --wait DURATION    check with this GPUCAP_WAIT
  --guarantee SPEC   check with this GPUCAP_GUARANTEE
  --ceiling SPEC     check with this GPUCAP_CEILING
  --write-env FILE   once valid, write the GPUCAP_* variables (flags applied) to FILE as
                     KEY=VALUE lines, atomically: the gpucap.env file the shim reads
                     when its environment has no GPUCAP_* variable (the container
                     entrypoint does this); a FILE already there is a ceiling: its
                     cap stays where the environment asks more, and what it sets
                     that the environment does not stays
  -h, --help         show this help

exit status: 0 if the configuration is valid and libgpucap.so was found, else 2.";

const STATUS_HELP: &str = "\
usage: gpucap status [--pool NAME|PATH | --all] [--json] [--uuid]
       gpucap status --prometheus [--pool NAME|PATH]... [--all] [--hami]

With no pool named (no --pool, no GPUCAP_POOL, no gpucap.env naming one): every
capped process of this user (root: of every user) once, one row per process and GPU,
pool members and processes capped on their own alike: GPU index, pid, user, pool (-:
capped alone), cap, used, used as a share of the cap, free (what it could still
take), peak, refusals and command, fitted to the terminal's width (else COLUMNS,
else 80 columns: the command is cut with …); then a line per pool and GPU. --uuid
adds each GPU's UUID; --json prints it all (docs/src/watching.md lists the fields).

With a pool named, shows that pool once (GPUCAP_POOL: the processes that name the same pool share one budget
per GPU): for each GPU its cap, the bytes in use, the peak, how many allocations the
pool refused, and the bytes still held by members that died (the next allocation that
needs them takes them back); for each member its pid, state (alive or dead), GPU,
bytes, peak, start time (UTC) and command, the largest first. The pool is --pool's,
else the one the environment names (GPUCAP_POOL, GPUCAP_POOL_DIR, a claim's
GPUCAP_CLAIM_DIR, HAMi-core's CUDA_DEVICE_MEMORY_SHARED_CACHE), else the one of the
gpucap.env file the shim reads
(beside libgpucap.so, else /etc/gpucap/gpucap.env: what the container entrypoint
wrote, so `docker exec CONTAINER gpucap top` shows the container's pool).
Reading a pool never changes it: the file is opened read-only.

options:
  --pool NAME|PATH   show this pool (a name, in GPUCAP_POOL_DIR or the default
                     directory, or the file's absolute path)
  --uuid             with no pool named: a column of each GPU's UUID
  --json             with no pool named: processes, pools, lone (see
                     docs/src/watching.md); with a pool, one JSON object: path, version, created, gpus [uuid, cap,
                     used, peak, refusals, largest_refused, held_by_dead], members
                     [slot, pid, pid_namespace, command, start_ms, alive, held_by_children, gpus [uuid,
                     used, peak]] (see docs/src/pools.md, \"Watching a pool: gpucap
                     status, gpucap top\")
  --prometheus       print Prometheus's text exposition format (version 0.0.4), for
                     node_exporter's textfile collector: the series gpucap metrics
                     serves (see docs/src/metrics.md); --pool may then be given
                     several times, each pool's series labelled pool=\"NAME\"
  --all              with no pool named: the pools no process uses (no live member,
                     nothing held; gpucap pool clean removes them) too, which are
                     left out otherwise; with --prometheus: every pool file (*.pool) in this user's pool
                     directory (gpucap-UID in GPUCAP_POOL_DIR or the default)
  --hami             with --prometheus: HAMi's monitor series too
                     (hami_vgpu_memory_used_bytes, hami_vgpu_memory_limit_bytes), so
                     HAMi's dashboards read gpucap (docs/src/metrics.md)
  -h, --help         show this help

exit status: 0; 1 if the pool's file does not exist (no process has joined the pool
yet); 2 for a bad value, a file that is not a pool file this gpucap can read, or
this user's pool directory (gpucap-UID) when it cannot be used (root's is a line
among what could not be read).
With --prometheus and no pool named or configured: every pool and every process capped
alone, as gpucap status shows them (as --all). With --prometheus the exposition is printed all the same, with
gpucap_pool_up 0 for a pool that could not be read (and the reason on stderr); with
--all, the *.pool files that are not pool files are counted per user
(gpucap_pool_files_unreadable), one line for them.";

const TOP_HELP: &str = "\
usage: gpucap top [--pool NAME|PATH] [--user NAME|UID] [--sort KEY] [--uuid]
                  [--interval SECS] [--iterations N | --once]

Shows every capped process, as gpucap status does, with a bar of used/cap, refreshed:
on a terminal the screen is redrawn to the window's size, asked at each refresh
(columns drop as it narrows: PEAK first, then REFUSED, FREE, USER, POOL, USE%, the
bar, CAP; commands are cut with …, never wrapped), as many rows as its height allows;
else (a pipe, TERM=dumb or unset), or with --once, every row, each snapshot after a
blank line. Ctrl-C ends it (top never changes the terminal's modes: keys typed show).
The pools no process uses (no live member, nothing held) are left out unless --pool
names one. Reading never changes a pool.

options:
  --pool NAME|PATH   only this pool's file, its members (its file must exist); without it, the
                     pool the environment names, else every process
  --user NAME|UID    only this user's processes
  --sort KEY         the order of the rows: used (default), peak, cap, free, use,
                     refused (the largest first), pid, gpu, pool, user, command
  --uuid             a column of each GPU's UUID
  --interval SECS    seconds between snapshots, from 0.2 to 60 (default 1)
  --iterations N     stop after N snapshots (default: run until interrupted)
  --once             one snapshot, every row, no screen codes (for a log)
  -h, --help         show this help

exit status: 0; 1 if the pool named does not exist; 2 for a bad value, or this
user's pool directory (gpucap-UID) when it cannot be used (root's is a line among
what could not be read).";

const METRICS_HELP: &str = "\
usage: gpucap metrics --listen ADDR:PORT [--pool NAME|PATH]... [--all] [--hami]

Serves pools to Prometheus: an HTTP/1.1 server where GET /metrics answers with
Prometheus's text exposition format (version 0.0.4) of the pools, read again at each
scrape: per GPU the cap, bytes used, peak, refusals, largest refused and bytes held
by dead members; per member its pid, command, bytes and peak, and whether it lives
(the series and their labels: docs/src/metrics.md). Any other path is 404. A thread
per connection (at most 256), each request answered then closed. It prints the address it listens on
(useful with port 0) on stderr, then a line whenever a pool becomes readable or
unreadable. Reading never changes a pool and never waits for its members: the file
is opened read-only and only loaded from.

Which pools: --pool's (several times for several), or with --all every pool file
(*.pool) in this user's pool directory and every container's pool beside it
(gpucap-container-NS), listed again at each scrape, else the one
gpucap status would show (GPUCAP_POOL, CUDA_DEVICE_MEMORY_SHARED_CACHE, gpucap.env).
A pool that no process has joined yet, or whose file cannot be read, is served as
gpucap_pool_up{pool=\"NAME\"} 0 until it can be; with --all, the *.pool files that
are not pool files are counted per user (gpucap_pool_files_unreadable), not served
one by one.

options:
  --listen ADDR:PORT  the address to listen on: 127.0.0.1:9400 (this machine only),
                      0.0.0.0:9400 or [::]:9400 (every interface: a sidecar scraped
                      by Prometheus); port 0 picks a free port
  --pool NAME|PATH    serve this pool (a name, in GPUCAP_POOL_DIR or the default
                      directory, or the file's absolute path); may be repeated
  --all               serve every pool of this user's pool directory, and the
                      containers' pools beside it
  --hami              HAMi's monitor series too (hami_vgpu_memory_used_bytes,
                      hami_vgpu_memory_limit_bytes), so HAMi's dashboards read
                      gpucap (docs/src/metrics.md)
  -h, --help          show this help

exit status: 2 if no pool is configured, for a bad value, or when it cannot listen;
otherwise it runs until killed (SIGTERM or Ctrl-C).";

const JUPYTER_HELP: &str = "\
usage: gpucap jupyter install [--limit SPEC] [--pool NAME|PATH] [--guarantee SPEC] [--ceiling SPEC]
                              [--wait DURATION] [--growth] [--log LEVEL] [--kernel NAME]
                              [--name NAME] [--display-name TEXT] [--user|--sys-prefix|--prefix DIR]
       gpucap jupyter list | remove NAME

install writes a Jupyter kernelspec (kernel.json) that starts an existing kernel (--kernel,
default python3) under `gpucap run` with these options: its argv, after
`gpucap run OPTIONS --`, is the wrapped kernel's (a bare python in it is resolved to the
interpreter of the kernel's environment), its language, env and metadata are copied, and
its display name gets the cap appended. The wrapped kernel is found with
`jupyter kernelspec list --json` (else in Jupyter's standard data directories). The
options are validated first, as `gpucap check` would with them: on an error nothing is
written. list shows the kernels gpucap installed; remove deletes one (only one that gpucap
installed).

options:
  --limit, --pool, --guarantee, --ceiling, --wait, --growth, --log
                     as for run; the kernel must be capped (--limit, --ceiling with
                     --pool, or a gpucap.env's cap): one that would run uncapped is
                     not installed
  --kernel NAME      the kernelspec to wrap (default: python3)
  --name NAME        the new kernelspec's name (default: KERNEL-gpucap-LIMIT, e.g.
                     python3-gpucap-8gi); letters, digits, '.', '_' and '-'
  --display-name TEXT  the name shown in Jupyter (default: the wrapped kernel's, with
                     the cap appended: \"Python 3 (ipykernel) [gpucap 8Gi]\")
  --user             write it in this user's Jupyter data directory (the default:
                     $JUPYTER_DATA_DIR, else ~/.local/share/jupyter)
  --sys-prefix       write it in the environment of the jupyter on PATH
                     (PREFIX/share/jupyter, where PREFIX/bin holds jupyter)
  --prefix DIR       write it in DIR/share/jupyter
  -h, --help         show this help

exit status: 2 for a usage or configuration error, or when the kernel to wrap is not
found or the kernelspec cannot be written; 0 otherwise.";
const CDI_HELP: &str = "\
gpucap cdi generate: write a Container Device Interface (CDI) spec with one device that
caps the containers given it, with no change to their image or entrypoint.

usage: gpucap cdi generate --output FILE [--limit SPEC [--pool NAME|PATH|off]] [--name NAME]
                           [--kind VENDOR/CLASS] [--dir DIR] [--root DIR]

It copies libgpucap.so and gpucap into DIR/NAME on the host with gpucap.env (the validated
GPUCAP_LIMIT and GPUCAP_POOL, with --limit) and a file naming the library, and writes the
spec FILE: its device mounts DIR/NAME read-only at /usr/local/lib/gpucap-cdi and that file
at /etc/ld.so.preload, so every process of the container loads the shim and reads
gpucap.env. A container without the device is untouched.

  podman run --device gpucap.io/gpu=capped IMAGE CMD    (the spec in /etc/cdi or /var/run/cdi)

options:
  --output FILE         where the spec goes, e.g. /etc/cdi/gpucap.json; required
  --limit SPEC          the cap, as GPUCAP_LIMIT (8Gi, 50%, 0=8Gi,1=4Gi, ...); without it
                        no gpucap.env: the device injects the library alone, and the
                        container's own variables (a DRA driver's, GPUCAP_*) set the cap
  --pool NAME|PATH|off  GPUCAP_POOL (default container-mntns, the container's mount
                        namespace's pool: the container's processes share the cap; off:
                        each process has it alone); only with --limit
  --name NAME           the device's name (default capped)
  --kind VENDOR/CLASS   the device's kind (default gpucap.io/gpu)
  --dir DIR             where the device's files go on the host (default /var/lib/gpucap/cdi)
  --root DIR            the host's / as this command sees it (a DaemonSet's host mount):
                        files are written under it, the spec names them without it
  -h, --help            show this help

exit status: 0 when written; 2 for a bad option or value, or a file it cannot write.";
const POOL_HELP: &str = "\
usage: gpucap pool list | gpucap pool clean [NAME]
       gpucap pool resize NAME|PATH|--claim DIR SIZE [--gpu N|UUID] [--dir DIR]
       gpucap pool set NAME|PATH|--claim DIR PID [--guarantee SIZE] [--ceiling SIZE|none]
                       [--gpu N|UUID] [--dir DIR]

list: every pool of this user's pool directory (GPUCAP_POOL_DIR, else /dev/shm,
else /tmp; in it gpucap-UID), with its members alive and
dead, the bytes it counts as held (all of them, and those of dead members) and its
last use (the file made or written, or a member joined; UTC).

clean: removes every pool with no live member and nothing held; with NAME, that pool
even if dead members still count bytes in it. A pool with a live member is never
removed. A member is alive while its process holds its slot's lock in the file;
clean takes every slot's lock before it removes a file, so a process joining at that
moment either keeps the pool (it took its slot first) or notices the file was
removed and joins a new one under the same name.

resize: changes the cap of a pool while its members run (SIZE as GPUCAP_LIMIT takes
it: 8Gi, 1.5GiB, 8G). A raise serves the members waiting for memory (GPUCAP_WAIT) at
once; a lower below what is in use takes nothing back: new allocations are refused
(or wait) until use falls under the new cap. A resize that would leave the live
members' guarantees (GPUCAP_GUARANTEE) above the cap is refused, naming them. Once
resized, the pool's cap is the one in force while members hold it: a member started
later with another GPUCAP_LIMIT joins with the pool's cap.

set: changes the guarantee (GPUCAP_GUARANTEE) or the ceiling (GPUCAP_CEILING) of the
member PID (as gpucap status shows it) while it runs. A raised ceiling serves the
member's request waiting at its old ceiling (GPUCAP_WAIT) at once; a ceiling lowered
below what the member holds takes nothing back: its new allocations are refused (or
wait) until it holds less. A guarantee is admitted as at start: refused, with the
figures, when the live members' guarantees would sum above the cap, when it is above
the member's ceiling, or when the memory in use leaves no room for it now.

options:
  --guarantee SIZE  set: the member's new guarantee (0: none)
  --ceiling SIZE    set: the member's new ceiling (none: the pool's cap)
  --gpu N|UUID   resize (set) one GPU of the pool (the member uses): its number as
                 `gpucap status --pool` lists them (from 0) or its UUID (default:
                 every GPU of the pool; of the member's)
  --dir DIR      the pool directory (default: GPUCAP_POOL_DIR, else as list)
  --claim DIR    a claim's pool: the directory its containers have as GPUCAP_CLAIM_DIR
  -h, --help     show this help

exit status: 0; 1 when the pool named does not exist or is in use (clean), or a
resize or set was refused (or named no live member); 2 for a usage error, a pool directory that is not safe
(another user's, or writable by others), or a file named that is not a pool file this gpucap can read.";

/// The help text of `topic`.
pub fn help(topic: Topic) -> &'static str {
    match topic {
        Topic::General => GENERAL_HELP,
        Topic::Run => RUN_HELP,
        Topic::Check => CHECK_HELP,
        Topic::Status => STATUS_HELP,
        Topic::Top => TOP_HELP,
        Topic::Metrics => METRICS_HELP,
        Topic::Jupyter => JUPYTER_HELP,
        Topic::Cdi => CDI_HELP,
        Topic::Pool => POOL_HELP,
    }
}

/// The usage lines of a command (`usage: gpucap metrics --listen ...`), shown under a
/// usage error; None for `gpucap` itself (its usage has a line per command).
pub fn usage_of(topic: Topic) -> Option<&'static str> {
    if topic == Topic::General {
        return None;
    }
    let text = help(topic);
    let start = text.find("usage: ")?;
    let rest = &text[start..];
    Some(rest.find("\n\n").map_or(rest, |end| &rest[..end]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_command_has_its_own_usage_lines() {
        assert_eq!(usage_of(Topic::General), None);
        for (topic, first) in [
            (Topic::Run, "usage: gpucap run ["),
            (Topic::Check, "usage: gpucap check ["),
            (Topic::Status, "usage: gpucap status ["),
            (Topic::Top, "usage: gpucap top ["),
            (Topic::Metrics, "usage: gpucap metrics --listen"),
            (Topic::Jupyter, "usage: gpucap jupyter install"),
            (Topic::Cdi, "usage: gpucap cdi generate"),
            (Topic::Pool, "usage: gpucap pool list"),
        ] {
            let u = usage_of(topic).unwrap();
            assert!(u.starts_with(first), "{topic:?}: {u}");
            assert!(u.lines().count() <= 4 && !u.contains("\n\n"), "{u}");
            // Only this command's usage.
            for other in [
                "run", "check", "status", "top", "metrics", "jupyter", "cdi", "pool",
            ] {
                if !first.contains(other) {
                    assert!(!u.contains(&format!("gpucap {other} ")), "{topic:?}: {u}");
                }
            }
        }
    }
}
