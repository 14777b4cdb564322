"""probe.py report PATH --cap N: judges a capped check by gpucap's own JSON usage report
(GPUCAP_REPORT, gpucap run --report): every process and GPU under the cap, its peak within
it, a refusal where one was expected, growth mode where it was asked for.
"""

import json

from verdicts import fail, mib, ok


def cmd_report(a):
    cap = a.cap
    try:
        with open(a.path) as f:
            data = json.load(f)
    except FileNotFoundError:
        fail("gpucap wrote no report at %s (the shim was not loaded, or the process never used the GPU)" % a.path)
    except ValueError as e:
        fail("the report %s is not JSON: %s" % (a.path, e))
    procs = data.get("processes") or []
    devices = [(p, d) for p in procs for d in (p.get("devices") or [])]
    if not devices:
        fail("the report lists no process that used a GPU")
    peak = max(d.get("peak", 0) for _, d in devices)
    refusals = sum(d.get("refusals", 0) for _, d in devices)
    allocations = sum(d.get("allocations", 0) for _, d in devices)
    for p, d in devices:
        if d.get("cap") != cap:
            fail("the report gives pid %s a cap of %s on GPU %s, not %d" % (p.get("pid"), d.get("cap"), d.get("ordinal"), cap))
        if d.get("peak", 0) > cap:
            fail("the report gives pid %s a peak of %s, over the %s cap" % (p.get("pid"), mib(d.get("peak")), mib(cap)))
        if a.growth and not p.get("growth"):
            fail("pid %s did not run in growth mode" % p.get("pid"))
    if a.expect_refusal and refusals < 1:
        fail("gpucap refused nothing: the out-of-memory error did not come from the cap")
    if a.min_peak and peak < a.min_peak:
        fail("the peak charged to the cap was %s, less than the %s expected" % (mib(peak), mib(a.min_peak)))
    ok("gpucap's report: %d process(es), peak %s of the %s cap, %d allocation(s), %d refusal(s)"
       % (len(procs), mib(peak), mib(cap), allocations, refusals))
