#!/usr/bin/env python3
"""The pool checks of scripts/gpu-check.sh (scripts/gpu/checks/pool.sh): four members of
one GPUCAP_POOL, driven by scripts/gpu/member.py (PyTorch on a real GPU, the driver API
through ctypes on the fake), with `gpucap metrics` scraped and NVML read from another
PID namespace while they run.

  pool_check.py --cli GPUCAP --cap BYTES --client driver|torch [--python PY]
                --uuid GPU-... [--smi nvidia-smi] [--timeout S] [--no-pidns REASON]
                [--keep DIR]    (the members' stderr, the metrics server's log, the scrapes)

Prints INFO lines, one `PART <name> OK|FAIL|SKIP: <detail>` line per check:
  pool          4 members share the cap; the 5th block past it is refused with the pool's
                line; a SIGKILLed holder's bytes serve another member within 1 s; a member
                with GPUCAP_WAIT=30s is served when a holder frees; the pool ends at 0
  pool-metrics  `gpucap metrics` scraped at each step: the exposition passes the rules of
                scripts/gpu/promcheck.py and its figures are the pool's (gpucap status)
  pool-pidns    as in a container, a fifth member and the monitors share a new PID
                namespace (`unshare -pf --mount-proc`, before the blocks): nvidia-smi's and
                NVML's memory.used is the pool's used; NVML lists every member by its own
                pid with its bytes; nvidia-smi lists at least the members of its namespace
then `OK:`/`FAIL:` for the whole (exit 0/1). A part the run did not reach is FAIL with
the reason the run stopped.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import promcheck  # noqa: E402
from child import Child  # noqa: E402
from verdicts import MiB, Outcome, fail, info, mib  # noqa: E402

PARTS = ("pool", "pool-metrics", "pool-pidns")


class Pool:
    def __init__(self, a):
        self.a = a
        self.dir = tempfile.mkdtemp(prefix="gpucap-poolcheck.")
        self.name = "gpurun%d" % os.getpid()
        self.env = dict(os.environ, GPUCAP_POOL_DIR=self.dir)
        self.env.pop("LD_PRELOAD", None)
        self.members = []  # [(Child, pid, stderr path)]
        self.server = None
        self.url = None
        self.scrapes = 0
        self.metric_notes = []

    def status(self):
        out = subprocess.run([self.a.cli, "status", "--pool", self.name, "--json"], env=self.env,
                             capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            fail("gpucap status --pool %s --json: exit %d: %s" % (self.name, out.returncode, out.stderr.strip()))
        return json.loads(out.stdout)

    def gpu(self, st):
        if len(st["gpus"]) != 1:
            fail("the pool has %d GPUs, not one: %s" % (len(st["gpus"]), st["gpus"]))
        return st["gpus"][0]

    # ---- members -------------------------------------------------------------------
    def start_member(self, i, wait=None):
        err = os.path.join(self.dir, "member%d.err" % i)
        env = dict(self.env)
        if wait:
            env["GPUCAP_WAIT"] = wait
        cmd = [self.a.cli, "run", "--limit", str(self.a.cap), "--pool", self.name, "--",
               self.a.python, os.path.join(HERE, "member.py"), "--client", self.a.client]
        info("member %d: %s%s" % (i, " ".join(cmd), " (GPUCAP_WAIT=%s)" % wait if wait else ""))
        c = Child(cmd, self.a.timeout, stderr=open(err, "w"), env=env)
        self.members.append((c, c.p.pid, err))

    def ask(self, i, line, token):
        c = self.members[i][0]
        c.send(line)
        return c.expect(token)

    def stderr_of(self, i):
        with open(self.members[i][2]) as f:
            return f.read()

    # ---- metrics -------------------------------------------------------------------
    def start_server(self):
        log = os.path.join(self.dir, "metrics.log")
        # SIGTERM held while it starts: a stop then finds self.server set and stops it too
        # (members need not: they exit at the end of their stdin)
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            self.server = subprocess.Popen([self.a.cli, "metrics", "--listen", "127.0.0.1:0", "--pool", self.name],
                                           env=self.env, stdout=subprocess.DEVNULL, stderr=open(log, "w"))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(r"serving (http://\S+/metrics)", open(log).read())
            if m:
                self.url = m.group(1)
                info("gpucap metrics: %s" % self.url)
                return
            if self.server.poll() is not None:
                break
            time.sleep(0.05)
        fail("gpucap metrics did not start serving: %s" % open(log).read().strip())

    def scrape(self, when):
        """The exposition, checked by promcheck's rules; {(name, labels...): value}."""
        t = time.monotonic()
        with urllib.request.urlopen(self.url, timeout=10) as r:
            ctype = r.headers.get("Content-Type", "")
            text = r.read().decode()
        ms = (time.monotonic() - t) * 1e3
        self.scrapes += 1
        with open(os.path.join(self.dir, "scrape%d.prom" % self.scrapes), "w") as f:
            f.write(text)
        if not ctype.startswith("text/plain; version=0.0.4"):
            raise MetricsWrong("%s: Content-Type %r, not text/plain; version=0.0.4" % (when, ctype))
        bad = promcheck.problems(text)
        if bad:
            raise MetricsWrong("%s: the exposition breaks the rules: %s" % (when, "; ".join(bad[:3])))
        info("scrape %d (%s): %d lines in %.1f ms, rules kept" % (self.scrapes, when, text.count("\n"), ms))
        return promcheck.samples(text)

    def stop(self):
        for c, _, _ in self.members:
            c.kill()
        if self.server is not None and self.server.poll() is None:
            self.server.kill()
            self.server.wait()


class MetricsWrong(Exception):
    pass


def value(samples, name, **want):
    got = [v for n, labels, v in samples if n == name and all(labels.get(k) == w for k, w in want.items())]
    if len(got) != 1:
        raise MetricsWrong("%d samples of %s%s, not one" % (len(got), name, want))
    return got[0]


def metrics_agree(p, when, st, dead=0, waiters=None):
    """The scrape's pool figures are gpucap status's."""
    s = p.scrape(when)
    g = p.gpu(st)
    lab = dict(pool=p.name, gpu_uuid=g["uuid"])
    checks = [("gpucap_pool_up", dict(pool=p.name), 1),
              ("gpucap_pool_cap_bytes", lab, g["cap"]),
              ("gpucap_pool_used_bytes", lab, g["used"]),
              ("gpucap_pool_refusals_total", lab, g["refusals"]),
              ("gpucap_pool_held_by_dead_bytes", lab, g["held_by_dead"]),
              ("gpucap_pool_members", dict(pool=p.name, state="alive"),
               sum(1 for m in st["members"] if m["alive"])),
              ("gpucap_pool_members", dict(pool=p.name, state="dead"), dead)]
    if waiters is not None:
        checks.append(("gpucap_pool_waiters", lab, waiters))
    for m in st["members"]:
        for mg in m["gpus"]:
            checks.append(("gpucap_member_used_bytes", dict(pool=p.name, pid=str(m["pid"]),
                                                            gpu_uuid=mg["uuid"]), mg["used"]))
    for name, labels, want in checks:
        got = value(s, name, **labels)
        if got != want:
            raise MetricsWrong("%s: %s%s is %s, gpucap status says %s" % (when, name, labels, got, want))
    p.metric_notes.append(when)
    return s


def pidns_view(p):
    """pool-pidns: as in a container, a member and the monitors share one new PID
    namespace (`unshare -pf --mount-proc`): pool_check.py --pidns-inner runs there."""
    o = subprocess.run(["unshare", "-pf", "--mount-proc", p.a.python, os.path.abspath(__file__), "--pidns-inner",
                        "--cli", p.a.cli, "--cap", str(p.a.cap), "--client", p.a.client, "--python", p.a.python,
                        "--smi", p.a.smi, "--uuid", p.a.uuid, "--timeout", str(p.a.timeout), "--pool", p.name],
                       env=p.env, capture_output=True, text=True, timeout=p.a.timeout + 60)
    for line in o.stdout.splitlines():
        if not line.startswith("PIDNS "):
            print(line, flush=True)
    for line in o.stderr.strip().splitlines()[-20:]:
        info("pidns| " + line)
    verdict = [ln for ln in o.stdout.splitlines() if ln.startswith("PIDNS ")]
    if not verdict:
        return "FAIL", "the run in a new PID namespace gave no verdict (exit %d): %s" % (o.returncode, o.stderr.strip()[-200:])
    status, _, detail = verdict[-1][len("PIDNS "):].partition(": ")
    return status, detail


def pidns_inner(a):
    """In a new PID namespace: one more member joins the pool and holds a block; then
    nvidia-smi and NVML (ctypes), run under the pool's settings in this namespace, must
    show the pool's used; NVML must list its members (each by the pid it has in its own
    namespace: this member's is one of this namespace's, the others' are not), and
    nvidia-smi's process table (the driver's, see below) this namespace's members."""
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    pre = [a.cli, "run", "--limit", str(a.cap), "--pool", a.pool, "--"]
    err = tempfile.NamedTemporaryFile("w+", prefix="gpucap-pidns-member.", suffix=".err")
    m = Child(pre + [a.python, os.path.join(HERE, "member.py"), "--client", a.client], a.timeout,
              stderr=err, env=env)
    try:
        m.expect("STARTED")
        m.send("init")
        info("member in this namespace: %s" % m.expect("READY"))
        m.send("alloc %d" % (16 * MiB))
        r = m.expect("ALLOC")
        if not r.startswith("ok"):
            err.seek(0)
            return "FAIL", "a member in a new PID namespace could not hold 16 MiB of the pool: %s %s" % (r, err.read()[-200:])
        out = subprocess.run([a.cli, "status", "--pool", a.pool, "--json"], env=env, capture_output=True,
                             text=True, timeout=60)
        st = json.loads(out.stdout)
        g = st["gpus"][0]
        want = {x["pid"]: sum(y["used"] for y in x["gpus"]) for x in st["members"]
                if x["alive"] and any(y["used"] for y in x["gpus"])}
        here = {pid for pid in want if os.path.exists("/proc/%d" % pid)}
        if m.p.pid not in want:
            return "FAIL", "the pool lists %s, not this namespace's member (pid %d)" % (sorted(want), m.p.pid)
        smi = subprocess.run(pre + [a.smi, "-i", a.uuid, "--query-gpu=memory.used,memory.total",
                                    "--format=csv,noheader,nounits"], env=env, capture_output=True, text=True, timeout=60)
        apps = subprocess.run(pre + [a.smi, "-i", a.uuid, "--query-compute-apps=pid,used_memory",
                                     "--format=csv,noheader,nounits"], env=env, capture_output=True, text=True, timeout=60)
        view = subprocess.run(pre + [a.python, os.path.abspath(__file__), "--nvml-view", a.uuid], env=env,
                              capture_output=True, text=True, timeout=60)
        for what, o in (("nvidia-smi --query-gpu", smi), ("nvidia-smi --query-compute-apps", apps), ("NVML", view)):
            info("in a new PID namespace, %s: exit %d: %s %s" % (what, o.returncode, o.stdout.strip().replace("\n", "; "),
                                                               o.stderr.strip()[:300]))
            if o.returncode != 0:
                return "FAIL", "%s in a new PID namespace failed (exit %d): %s" % (what, o.returncode, o.stderr.strip()[:200])
        used_mib, total_mib = [int(x) for x in smi.stdout.strip().splitlines()[-1].split(",")]
        if abs(used_mib - g["used"] // MiB) > 1 or abs(total_mib - a.cap // MiB) > 1:
            return "FAIL", ("nvidia-smi in a PID namespace shows memory.used %d MiB of %d MiB; the pool holds %s of %s"
                            % (used_mib, total_mib, mib(g["used"]), mib(a.cap)))
        nv = json.loads(view.stdout.strip().splitlines()[-1])
        nv_pids = {int(k): v for k, v in nv["processes"].items()}
        if nv["used"] != g["used"] or nv["total"] != a.cap or nv_pids != want:
            return "FAIL", ("NVML in a PID namespace: used %s, total %s, processes %s; the pool: used %s, cap %s, members %s"
                            % (nv["used"], nv["total"], nv_pids, g["used"], a.cap, want))
        smi_pids = {}
        for line in apps.stdout.strip().splitlines():
            pid, used = [x.strip() for x in line.split(",")]
            smi_pids[int(pid)] = int(used)
        # nvidia-smi 580 reads its process table through NVML's private export table
        # (nvmlInternalGetExportTable; docs/gpu-runs/2026-11-26-h100/nvidia-smi-processes.txt),
        # not through a public call gpucap answers: its column is the driver's own figure,
        # for the processes of its PID namespace. So: the members of this namespace must be
        # listed, by their pids here; their bytes are reported beside gpucap's charge, not
        # compared (the driver's include what gpucap cannot see: lazily loaded kernels).
        missing = sorted(k for k in here if k not in smi_pids)
        if missing:
            return "FAIL", ("nvidia-smi --query-compute-apps in a PID namespace lists %s (MiB); this namespace's "
                            "members %s are not among them" % (smi_pids, missing))
        shown = ", ".join("pid %d: %d MiB (gpucap's charge %s)" % (k, smi_pids[k], mib(want[k])) for k in sorted(here))
        return "OK", ("nvidia-smi and NVML in a new PID namespace show the pool's used %s of %s; NVML lists its %d "
                      "members by their own pids %s, nvidia-smi this namespace's %s (and lists %s; its column is "
                      "the driver's own figure: %s)"
                      % (mib(g["used"]), mib(a.cap), len(want), sorted(want), sorted(here), sorted(smi_pids), shown))
    finally:
        # a clean exit empties its slot (a kill would leave a dead member to the next steps)
        if m.p.poll() is None:
            m.send("quit")
            try:
                m.p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                m.kill()
        err.close()


def nvml_view():
    """--nvml-view UUID: the GPU's memory and processes as NVML says, as one JSON line."""
    from nvml_ctypes import Nvml
    n = Nvml()
    h = n.handle(sys.argv[2])
    total, free, used = n.memory(h)
    print(json.dumps({"total": total, "free": free, "used": used,
                      "processes": {str(k): v for k, v in n.processes(h).items()}}))
    return 0


def scenario(p, parts):
    a = p.a
    p.start_server()
    s0 = p.scrape("before any member")
    if value(s0, "gpucap_pool_up", pool=p.name) != 0:
        raise MetricsWrong("gpucap_pool_up is not 0 before any member joined")
    for i in range(4):
        p.start_member(i, wait="30s" if i == 1 else None)
    for i in range(4):
        p.members[i][0].expect("STARTED")
    for i in range(4):  # one context at a time: each is measured alone
        info("member %d ready: %s" % (i, p.ask(i, "init", "READY")))
    # before the blocks, while the pool has room for one more member's context
    parts["pool-pidns"] = ("SKIP", a.no_pidns) if a.no_pidns else pidns_view(p)
    st = p.status()
    u0 = p.gpu(st)["used"]
    room = a.cap - u0
    block = room * 2 // 9 // (2 * MiB) * (2 * MiB)
    info("the 4 contexts hold %s of the pool's %s: blocks of %s" % (mib(u0), mib(a.cap), mib(block)))
    if block < 2 * MiB:
        fail("the members' contexts leave %s of the %s cap: no room for the check (raise --cap-mib)"
             % (mib(room), mib(a.cap)))
    for i in range(4):
        r = p.ask(i, "alloc %d" % block, "ALLOC")
        if not r.startswith("ok"):
            fail("member %d's block of %s (%d of 4) was refused with %s in use: %s"
                 % (i, mib(block), i + 1, mib(u0 + i * block), r))
    st = p.status()
    used = p.gpu(st)["used"]
    if used < u0 + 4 * block or used > a.cap:
        fail("after 4 blocks of %s the pool holds %s (contexts %s)" % (mib(block), mib(used), mib(u0)))
    metrics_agree(p, "4 members holding", st)
    r = p.ask(0, "alloc %d" % block, "ALLOC")
    if not r.startswith("oom"):
        fail("the 5th block of %s went past the pool's %s cap (%s in use): %s" % (mib(block), mib(a.cap), mib(used), r))
    pool_file = os.path.join(p.dir, "gpucap-%d" % os.geteuid(), p.name + ".pool")
    line = [ln for ln in p.stderr_of(0).splitlines() if "refused" in ln]
    if not line or "of the pool's" not in line[-1] or "(pool %s)" % pool_file not in line[-1]:
        fail("member 0's refusal did not say the pool's line (want \"... of the pool's ... cap in use ... "
             "(pool %s)\"): %s" % (pool_file, line[-1:] or p.stderr_of(0)[-300:]))
    info("5th block refused: %s" % line[-1])
    # SIGKILL member 3 while it holds; its share must serve member 0 at once.
    c3, pid3, _ = p.members[3]
    t_kill = time.monotonic()
    os.kill(pid3, signal.SIGKILL)
    c3.p.wait()
    st = p.status()
    metrics_agree(p, "a member killed", st, dead=1)
    r = p.ask(0, "alloc %d" % block, "ALLOC")
    served = time.monotonic() - t_kill
    if not r.startswith("ok"):
        fail("after member 3 (pid %d) was SIGKILLed holding %s, member 0's block was refused: %s"
             % (pid3, mib(block), r))
    if served > 1.0:
        fail("member 0 got the killed member's bytes %.3f s after the kill, not within 1 s" % served)
    info("killed member's bytes served member 0 %.0f ms after the SIGKILL" % (served * 1e3))
    # GPUCAP_WAIT: member 1 asks for just more than the pool has free (the killed
    # member's context came back too); member 2 frees its block, which makes room.
    room_now = a.cap - p.gpu(p.status())["used"]
    want = (room_now // (2 * MiB) + 1) * (2 * MiB)
    if want > room_now + block:
        fail("the pool has %s free after the kill: no request waits for member 2's %s" % (mib(room_now), mib(block)))
    info("member 1 asks for %s with %s free in the pool" % (mib(want), mib(room_now)))
    p.members[1][0].send("alloc %d" % want)
    deadline = time.monotonic() + 20
    while True:
        st = p.status()
        waiting = "waiting for" in p.stderr_of(1)
        if waiting:
            break
        if time.monotonic() > deadline:
            fail("member 1 (GPUCAP_WAIT=30s) did not start waiting for its block: %s" % p.stderr_of(1)[-300:])
        time.sleep(0.05)
    metrics_agree(p, "member 1 waiting", st, waiters=1)
    t_free = time.monotonic()
    r2 = p.ask(2, "free", "FREED")
    r = p.members[1][0].expect("ALLOC")
    after = time.monotonic() - t_free
    if not r.startswith("ok"):
        fail("member 1 (GPUCAP_WAIT=30s) was not served when member 2 freed %s: %s" % (r2, r))
    got = [ln for ln in p.stderr_of(1).splitlines() if "after waiting" in ln]
    info("member 1 served %.0f ms after member 2 freed: %s" % (after * 1e3, got[-1:] or "(no line)"))
    if not got:
        fail("member 1 was served but did not say it waited (\"got ... after waiting\"): %s" % p.stderr_of(1)[-300:])
    st = p.status()
    g = p.gpu(st)
    s = metrics_agree(p, "after the wait", st)
    lab = dict(pool=p.name, gpu_uuid=g["uuid"])
    if value(s, "gpucap_pool_waits_total", **lab) < 1 or value(s, "gpucap_pool_refusals_total", **lab) < 1:
        raise MetricsWrong("after a wait and a refusal, waits_total %s, refusals_total %s"
                           % (value(s, "gpucap_pool_waits_total", **lab), value(s, "gpucap_pool_refusals_total", **lab)))
    for i in (0, 1, 2):
        p.members[i][0].send("quit")
        rc = p.members[i][0].finish()
        if rc != 0:
            fail("member %d exited with status %s" % (i, rc))
    g = p.gpu(p.status())
    if g["used"] != 0:
        fail("every member gone, the pool still holds %s" % mib(g["used"]))
    parts["pool-metrics"] = ("OK", "%d scrapes of gpucap metrics kept the exposition rules and showed the pool's "
                                   "figures (%s)" % (p.scrapes, ", ".join(p.metric_notes)))
    return ("4 %s members shared the %s cap (blocks of %s, contexts %s); the 5th block was refused with the pool's "
            "line; a SIGKILLed holder's bytes served another member %.0f ms after the kill; a GPUCAP_WAIT=30s member "
            "was served %.0f ms after a holder freed; the pool ended at 0"
            % (a.client, mib(a.cap), mib(block), mib(u0), served * 1e3, after * 1e3))


def main(argv):
    if argv[:1] == ["--nvml-view"]:
        return nvml_view()
    if argv[:1] == ["--pidns-inner"]:
        ap = argparse.ArgumentParser()
        for opt in ("--cli", "--client", "--python", "--smi", "--uuid", "--pool"):
            ap.add_argument(opt, required=True)
        ap.add_argument("--cap", type=int, required=True)
        ap.add_argument("--timeout", type=int, required=True)
        a = ap.parse_args(argv[1:])
        try:
            status, detail = pidns_inner(a)
        except Outcome as o:
            status, detail = o.status, o.message
        except Exception as e:  # noqa: BLE001
            status, detail = "FAIL", "unexpected %s: %s" % (type(e).__name__, e)
        print("PIDNS %s: %s" % (status, detail), flush=True)
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--cli", required=True)
    ap.add_argument("--cap", type=int, required=True)
    ap.add_argument("--client", choices=("driver", "torch"), required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--smi", default="nvidia-smi")
    ap.add_argument("--uuid", required=True, help="the GPU's UUID (CUDA_VISIBLE_DEVICES names it too)")
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--no-pidns", metavar="REASON", help="skip pool-pidns, saying why")
    ap.add_argument("--keep", metavar="DIR", help="copy the members' stderr and the scrapes there")
    a = ap.parse_args(argv)
    p = Pool(a)

    def stopped(signum, _frame):  # stopped from outside (a time limit): members and server go too
        raise Outcome("FAIL", "stopped by signal %d" % signum)
    signal.signal(signal.SIGTERM, stopped)
    parts = {}
    try:
        parts["pool"] = ("OK", scenario(p, parts))
        status, msg = "OK", parts["pool"][1]
    except MetricsWrong as e:
        parts["pool-metrics"] = ("FAIL", str(e))
        status, msg = "FAIL", "gpucap metrics: %s" % e
    except Outcome as o:
        status, msg = o.status, o.message
    except Exception as e:  # noqa: BLE001
        status, msg = "FAIL", "unexpected %s: %s" % (type(e).__name__, e)
    finally:
        p.stop()
        if a.keep:
            os.makedirs(a.keep, exist_ok=True)
            for f in os.listdir(p.dir):
                if f.endswith((".err", ".prom", ".log")):
                    shutil.copy(os.path.join(p.dir, f), a.keep)
    for name in PARTS:
        st, detail = parts.get(name, ("FAIL", "the pool run stopped before this part: %s" % msg))
        if name == "pool" and status != "OK":
            st, detail = status, msg
        print("PART %s %s: %s" % (name, st, detail), flush=True)
    print("%s: %s" % (status, msg), flush=True)
    return 0 if status == "OK" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
