"""The verdict protocol of the real-GPU checks (scripts/gpu-check.sh and the scripts of
scripts/gpu/): each check prints INFO lines, FIGURE lines for the figures the run records,
and one last line with its exit status:
  "OK: <detail>"    exit 0
  "FAIL: <why>"     exit 1
  "SKIP: <reason>"  exit 77 (a framework or package is missing)
A check ends by raising its verdict (ok, fail, skip); `concluded` prints it. Beside them, the
formatting of sizes and the check of what a framework's memory figures show under the cap.
Needs only the standard library.
"""

MiB = 1 << 20
GiB = 1 << 30
SKIP_RC = 77


class Outcome(Exception):
    """Ends a probe: status is OK, FAIL or SKIP."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def ok(msg):
    raise Outcome("OK", msg)


def fail(msg):
    raise Outcome("FAIL", msg)


def skip(msg):
    raise Outcome("SKIP", msg)


def info(msg):
    print("INFO: " + msg, flush=True)


def concluded(run):
    """Runs `run` (which ends with ok, fail or skip), prints its verdict line and returns
    its exit status (0, 1, 77); an unexpected exception is a FAIL."""
    try:
        run()
    except Outcome as o:
        print("%s: %s" % (o.status, o.message), flush=True)
        return {"OK": 0, "FAIL": 1, "SKIP": SKIP_RC}[o.status]
    except Exception as e:  # noqa: BLE001
        print("FAIL: unexpected %s: %s" % (type(e).__name__, e), flush=True)
        return 1
    print("FAIL: the check ended without a verdict", flush=True)
    return 1


def figure(key, value):
    print("FIGURE %s %s" % (key, value), flush=True)


def mib(n):
    if n is None:
        return "?"
    return "%.1f MiB" % (n / MiB)


def align2m(n):
    """Rounds down to a multiple of 2 MiB, at least 2 MiB."""
    n = int(n) // (2 * MiB) * (2 * MiB)
    return max(n, 2 * MiB)


def first_line(e):
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:300]


def parse_kv(s):
    out = {}
    for part in s.split():
        if "=" in part:
            k, v = part.split("=", 1)
            out[k] = v
    return out


def shows_the_cap(call, name, free, total, cap):
    """What a framework's memory figures (`call`, named `name` in a failure) say before any
    allocation under gpucap: the cap as the total, at most the cap free, and most of it."""
    info("%s: free %s, total %s" % (call, mib(free), mib(total)))
    if total != cap:
        fail("%s total is %d (%s), not the cap %d" % (name, total, mib(total), cap))
    if free > cap:
        fail("%s free %d is more than the cap" % (name, free))
    if free < cap // 4:
        fail("only %s of the %s cap is free before any allocation" % (mib(free), mib(cap)))
