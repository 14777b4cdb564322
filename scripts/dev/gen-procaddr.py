#!/usr/bin/env python3
"""Generate cuda-stubs/src/procaddr_table.txt from NVIDIA's public CUDA headers.

Usage: scripts/dev/gen-procaddr.py [--source "where the headers came from"] \
           path/to/cuda.h path/to/cudaTypedefs.h path/to/cudaProfiler.h path/to/cudaProfilerTypedefs.h \
           [path/to/cudaGL.h path/to/cudaGLTypedefs.h path/to/cudaEGL.h path/to/cudaEGLTypedefs.h \
            path/to/cudaVDPAU.h path/to/cudaVDPAUTypedefs.h] > cuda-stubs/src/procaddr_table.txt

The OpenGL, EGL and VDPAU interop headers (same wheel and directory as cuda.h) add the
interop entry points libcuda.so.1 exports (and clients ask cuGetProcAddress for).

The headers are not committed. cuda.h, cudaTypedefs.h and cudaProfilerTypedefs.h ship in the
`nvidia-cuda-runtime` (13.x) wheel (nvidia/cu13/include/; the 12.x wheels,
nvidia-cuda-runtime-cu12, have them in nvidia/cuda_runtime/include/); cudaProfiler.h, which
declares cuProfilerInitialize/Start/Stop (exported by libcuda.so.1 like the rest of the driver
API), ships in the `nvidia-cuda-profiler-api` wheel (same directory). The profiler pair may be
left out (with a warning): the table then lacks the cuProfiler* rows.

Facts used:
  * cudaTypedefs.h declares `PFN_<base>_v<NNNN>` for every ABI variant of a driver entry point
    (NNNN = the CUDA version that introduced it) and `PFN_<base>_v<NNNN>_ptds|_ptsz` for the
    per-thread-default-stream variants. `#define PFN_<base> PFN_<base>_v<NNNN>` and
    `__API_TYPEDEF_PTDS/PTSZ(PFN_<base>, default, ptds)` name the newest ones.
  * The exported symbol of the k-th (by version) default variant is `<base>` for k=0 and
    `<base>_v<k+1>` after that (cuMemAlloc@2000 -> cuMemAlloc, @3020 -> cuMemAlloc_v2), which
    matches cuda.h's `#define cuX cuX_vN` lines.
  * A per-thread variant introduced at version V is `<default variant current at V>_ptds|_ptsz`
    (cuMemcpyHtoD_v7000_ptds -> cuMemcpyHtoD_v2_ptds), matching cuda.h's
    `__CUDA_API_PTDS(cuMemcpyHtoD_v2)` lines.
  * cuda.h: `#define cuGraphInstantiate cuGraphInstantiateWithFlags` (CUDA 12.0), so the base
    name cuGraphInstantiate resolves to cuGraphInstantiateWithFlags from 12000 on.
Every generated export name is checked against the declarations in the headers given.

Output: one line per variant: `base export since per_thread(0/1)`.
"""
import argparse
import os
import re
import sys
from collections import defaultdict

# The header files read (declarations, typedefs), and whether each must be given.
HEADERS = {
    "cuda.h": True,
    "cudaTypedefs.h": True,
    "cudaProfiler.h": False,
    "cudaProfilerTypedefs.h": False,
    "cudaGL.h": False,
    "cudaGLTypedefs.h": False,
    "cudaEGL.h": False,
    "cudaEGLTypedefs.h": False,
    "cudaVDPAU.h": False,
    "cudaVDPAUTypedefs.h": False,
}
# Declared in the headers given, but not entry points of the Linux driver: left out,
# each with why (written as comments in the table).
LEFT_OUT = {
    "cuWGLGetDevice": "Windows only (cudaGL.h declares it under _WIN32)",
    "cuEventCreateFromEGLSync": "the Linux driver 580.159.04 answers SYMBOL_NOT_FOUND for it "
    "(tests/driver-answers/h200-580.159.04.json)",
}
DECLARATIONS = ("cuda.h", "cudaProfiler.h", "cudaGL.h", "cudaEGL.h", "cudaVDPAU.h")
TYPEDEFS = ("cudaTypedefs.h", "cudaProfilerTypedefs.h", "cudaGLTypedefs.h", "cudaEGLTypedefs.h", "cudaVDPAUTypedefs.h")


def read_headers(paths):
    """{basename: text} for the headers given; exits naming what is wrong."""
    known = HEADERS
    texts = {}
    for path in paths:
        name = os.path.basename(path)
        if name not in known:
            sys.exit(f"gen-procaddr: {path}: not one of the headers read ({', '.join(known)})")
        if name in texts:
            sys.exit(f"gen-procaddr: {name} given twice")
        try:
            with open(path) as f:
                texts[name] = f.read()
        except OSError as e:
            sys.exit(f"gen-procaddr: cannot read {path}: {e.strerror}")
    for name, required in known.items():
        if name in texts:
            continue
        if required:
            sys.exit(f"gen-procaddr: {name} missing (give {', '.join(known)})")
        print(f"gen-procaddr: warning: {name} not given: its entry points are left out", file=sys.stderr)
    return texts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default="the headers given on the command line",
                    help="where the headers came from (written in the table's header)")
    ap.add_argument("headers", nargs="+", help="cuda.h cudaTypedefs.h cudaProfiler.h cudaProfilerTypedefs.h")
    args = ap.parse_args()
    source = args.source
    texts = read_headers(args.headers)
    cuda_h = "\n".join(texts[n] for n in DECLARATIONS if n in texts)
    typedefs_h = "\n".join(texts[n] for n in TYPEDEFS if n in texts)

    m = re.search(r"#define\s+CUDA_VERSION\s+(\d+)", texts["cuda.h"])
    cuda_version = m.group(1) if m else "unknown"

    default = defaultdict(set)  # base -> {version}
    per_thread = defaultdict(set)  # base -> {(version, suffix)}

    for name in re.findall(r"typedef\s+CUresult\s*\(\s*CUDAAPI\s*\*\s*PFN_(\w+)\s*\)", typedefs_h):
        mm = re.fullmatch(r"(\w+?)_v(\d+)(?:_(ptds|ptsz))?", name)
        if not mm:
            continue  # unversioned typedef (e.g. PFN_cuModuleGetFunctionCount): see the #defines
        base, ver, pt = mm.group(1), int(mm.group(2)), mm.group(3)
        (per_thread[base].add((ver, pt)) if pt else default[base].add(ver))
    for base, tbase, ver in re.findall(r"#define\s+PFN_(\w+)\s+PFN_(\w+?)_v(\d+)\s*$", typedefs_h, re.M):
        if base == tbase:
            default[base].add(int(ver))
    for base, kind, dver, pver in re.findall(
        r"#define\s+PFN_(\w+)\s+__API_TYPEDEF_(PTDS|PTSZ)\(PFN_(?:\w+?),\s*(\d+),\s*(\d+)\)", typedefs_h
    ):
        if re.search(r"_v\d+$", base):
            continue  # e.g. PFN_cuStreamGetCaptureInfo_v2 aliases a versioned typedef
        default[base].add(int(dver))
        per_thread[base].add((int(pver), kind.lower()))

    declared = set(re.findall(r"CUresult\s+CUDAAPI\s+(\w+)\s*\(", cuda_h))
    # A declaration `cuMemAlloc(` is compiled as cuMemAlloc_v2 through `#define cuMemAlloc cuMemAlloc_v2`,
    # and as cuMemcpyHtoD_v2 / cuMemcpyHtoD_v2_ptds through `__CUDA_API_PTDS(cuMemcpyHtoD_v2)`.
    for src, dst in re.findall(r"#define\s+(cu\w+)\s+(cu\w+)\s*$", cuda_h, re.M):
        if src in declared:
            declared.add(dst)
    for src, kind, api in re.findall(r"#define\s+(cu\w+)\s+__CUDA_API_(PTDS|PTSZ)\((\w+)\)", cuda_h):
        if src in declared or api in declared:
            declared.update((api, f"{api}_{kind.lower()}"))

    rows = []
    missing = []
    for base in sorted(default):
        if base in LEFT_OUT:
            continue
        versions = sorted(default[base])
        names = {}
        for k, ver in enumerate(versions):
            names[ver] = base if k == 0 else f"{base}_v{k + 1}"
        if base == "cuGraphInstantiate":
            names[12000] = "cuGraphInstantiateWithFlags"
        for ver in sorted(names):
            rows.append((base, names[ver], ver, 0))
        for ver, pt in sorted(per_thread.get(base, ())):
            current = max((v for v in names if v <= ver), default=None)
            if current is None:
                missing.append(f"{base} {pt}@{ver}: no default variant")
                continue
            rows.append((base, f"{names[current]}_{pt}", ver, 1))
    for base in per_thread:
        if base not in default:
            missing.append(f"{base}: per-thread variant without default")
    for r in rows:
        if r[1] not in declared:
            missing.append(f"{r[0]}@{r[2]} -> {r[1]} not declared in {' or '.join(n for n in DECLARATIONS if n in texts)}")
    for msg in missing:
        print("gen-procaddr: warning:", msg, file=sys.stderr)

    print(f"# Generated by scripts/dev/gen-procaddr.py from NVIDIA {' + '.join(n for n in HEADERS if n in texts)}, CUDA_VERSION {cuda_version}")
    print(f"# Headers: {source}. Do not edit.")
    for base, why in sorted(LEFT_OUT.items()):
        if base in default:
            print(f"# left out: {base}: {why}")
    print("# base_name export_name since_version per_thread(0/1)")
    for r in rows:
        print(*r)


if __name__ == "__main__":
    main()
