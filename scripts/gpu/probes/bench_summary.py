"""probe.py bench-summary: the benchmark figures of a prepared run (a TSV of group, key, mode,
value rows; the checks' figures and verdicts; the run's facts) as one JSON document and a
table: medians per mode and their ratios to the raw driver's.
"""

import json
import os
import statistics
import time

from verdicts import MiB, mib, ok


def median_or_none(values):
    return round(statistics.median(values), 2) if values else None


def cmd_bench_summary(a):
    rows = {}  # (group, key) -> {mode: [values]}
    with open(a.tsv) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 4:
                continue
            group, key, mode, value = parts
            rows.setdefault((group, key), {}).setdefault(mode, []).append(float(value))
    figures = {}
    if a.figures and os.path.exists(a.figures):
        with open(a.figures) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2:
                    try:
                        figures[parts[0]] = int(parts[1])
                    except ValueError:
                        figures[parts[0]] = parts[1]
    meta = {}
    for kv in a.meta or []:
        k, _, v = kv.partition("=")
        meta[k] = v
    checks = []
    if a.checks and os.path.exists(a.checks):
        with open(a.checks) as f:
            for line in f:
                status, _, rest = line.rstrip("\n").partition(" ")
                name, _, detail = rest.partition(" ")
                checks.append({"name": name, "status": status, "detail": detail})

    def entry(group, key, unit):
        modes = rows.get((group, key), {})
        e = {}
        for mode in ("raw", "gpucap", "growth"):
            vals = modes.get(mode, [])
            e["%s_%s" % (mode, unit)] = median_or_none(vals)
            e["%s_runs" % mode] = vals
        raw = e["raw_%s" % unit]
        for mode in ("gpucap", "growth"):
            v = e["%s_%s" % (mode, unit)]
            e["%s_ratio" % mode] = round(v / raw, 4) if (v is not None and raw) else None
        return e

    alloc = []
    for (group, key) in sorted(k for k in rows if k[0] == "pair"):
        e = {"size": int(key)}
        e.update(entry(group, key, "ns"))
        alloc.append(e)
    alloc.sort(key=lambda e: e["size"])
    churn = entry("churn", "mixed", "ns") if ("churn", "mixed") in rows else None
    train = entry("train", "resnet18", "ms") if ("train", "resnet18") in rows else None

    doc = {
        "gpucap_gpu_bench": 1,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "gpu": {"name": meta.get("gpu_name"), "driver_version": meta.get("driver_version"),
                "memory_total_mib": int(meta["memory_total_mib"]) if meta.get("memory_total_mib", "").isdigit() else None,
                "cuda_toolkit": meta.get("cuda_toolkit")},
        "host": meta.get("host"),
        "cap_bytes": int(meta["cap_bytes"]) if meta.get("cap_bytes", "").isdigit() else None,
        "train_cap_bytes": int(meta["train_cap_bytes"]) if meta.get("train_cap_bytes", "").isdigit() else None,
        "versions": {k[len("version_"):]: v for k, v in meta.items() if k.startswith("version_")},
        "method": {
            "reps": int(meta.get("reps", 0) or 0),
            "target_ms": int(meta.get("target_ms", 0) or 0),
            "modes": {"raw": "no shim", "gpucap": "gpucap run --limit CAP",
                      "growth": "gpucap run --growth --limit CAP"},
            "alloc_free": "drvbench pair SIZE: ns per cuMemAlloc + cuMemFree pair, median over reps",
            "churn": "drvbench churn: ns per free + alloc over 32 live blocks of 64 KiB..%s bytes"
                     % meta.get("churn_max_bytes", "?"),
            "train": "ResNet-18-like net, SGD, batch %s of 3x%sx%s random images, ms per step over %s steps "
                     "after %s warm-up steps" % (meta.get("train_batch"), meta.get("train_image"),
                                                 meta.get("train_image"), meta.get("train_steps"),
                                                 meta.get("train_warmup")),
        },
        "alloc_free": alloc,
        "churn": churn,
        "torch_train": train,
        "context_overhead": {k: v for k, v in figures.items() if k.startswith("ctx_overhead")} or None,
        "figures": figures,
        "checks": checks,
    }
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

    def fmt(v, digits=1):
        return "-" if v is None else ("%.*f" % (digits, v))

    print()
    print("GPU: %s, driver %s; cap %s" % (meta.get("gpu_name"), meta.get("driver_version"),
                                         mib(doc["cap_bytes"]) if doc["cap_bytes"] else "?"))
    print("%-34s %12s %12s %12s %8s %8s" % ("", "raw", "gpucap", "growth", "ratio", "growth"))
    for e in alloc:
        size = e["size"]
        label = "%d KiB" % (size >> 10) if size < MiB else "%d MiB" % (size >> 20)
        print("%-34s %12s %12s %12s %8s %8s" % (
            "cuMemAlloc+cuMemFree %s (ns)" % label, fmt(e["raw_ns"]), fmt(e["gpucap_ns"]),
            fmt(e["growth_ns"]), fmt(e["gpucap_ratio"], 3), fmt(e["growth_ratio"], 3)))
    if churn:
        print("%-34s %12s %12s %12s %8s %8s" % (
            "alloc/free churn (ns per op)", fmt(churn["raw_ns"]), fmt(churn["gpucap_ns"]),
            fmt(churn["growth_ns"]), fmt(churn["gpucap_ratio"], 3), fmt(churn["growth_ratio"], 3)))
    if train:
        print("%-34s %12s %12s %12s %8s %8s" % (
            "ResNet-18-like step (ms)", fmt(train["raw_ms"], 3), fmt(train["gpucap_ms"], 3),
            fmt(train["growth_ms"], 3), fmt(train["gpucap_ratio"], 3), fmt(train["growth_ratio"], 3)))
    if "ctx_overhead_raw_bytes" in figures:
        print("first CUDA context: %s of device memory (%s under gpucap); charged to the cap before any "
              "allocation: %s" % (mib(figures["ctx_overhead_raw_bytes"]), mib(figures.get("ctx_overhead_gpucap_bytes")),
                                  mib(figures.get("ctx_charged_bytes"))))
    print("wrote %s" % a.out)
    ok("wrote %s" % a.out)
