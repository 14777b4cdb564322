#!/usr/bin/env python3
"""Writes a base image's root file system as a tar file, from this Debian machine's own
installed packages: the files of a few packages (dash, coreutils, grep, and what they
depend on, recursively) with no download, in seconds. scripts/dev/containers-setup.sh imports
it with `podman import`; it is a plain Debian user space with no gpucap in it, with the
machine's glibc (the binaries the tests mount need no newer).

    python3 scripts/dev/containers-base.py OUT.tar

Documentation, manual pages and locales are left out. The layout is /usr-merged (bin, sbin,
lib, lib64 are links into usr/), as Debian's since bookworm.
"""

import io
import os
import re
import subprocess
import sys
import tarfile

ROOTS = ["dash", "coreutils", "grep", "sed", "findutils", "diffutils", "base-files"]
SKIP = ("/usr/share/doc/", "/usr/share/man/", "/usr/share/locale/", "/usr/share/info/",
        "/usr/share/lintian/")


def depends(pkg):
    out = subprocess.run(["dpkg-query", "-W", "-f=${Depends}, ${Pre-Depends}", pkg],
                         capture_output=True, text=True, check=True).stdout
    names = []
    for item in out.split(","):
        alt = item.split("|")[0].strip()  # the first of alternatives
        name = re.split(r"[\s(:]", alt, maxsplit=1)[0]
        if name:
            names.append(name)
    return names


def installed(pkg):
    r = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status}", pkg],
                       capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.strip() == "installed"


def closure(roots):
    seen, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        if p in seen or not installed(p):
            continue
        seen.add(p)
        todo.extend(depends(p))
    return sorted(seen)


def canonical(path):
    """The path with its directory's links resolved (/bin/dash -> /usr/bin/dash)."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    files = set()
    for pkg in closure(ROOTS):
        listing = subprocess.run(["dpkg", "-L", pkg], capture_output=True, text=True,
                                 check=True).stdout.splitlines()
        for f in listing:
            c = canonical(f)
            if c.startswith(SKIP) or not os.path.lexists(c) or (os.path.isdir(c) and not os.path.islink(c)):
                continue
            files.add(c)
    dirs = {"/tmp", "/var/tmp", "/etc", "/root", "/dev", "/proc", "/sys", "/run", "/usr/bin",
            "/usr/sbin", "/usr/lib", "/usr/lib64", "/usr/local/bin", "/usr/local/lib", "/opt"}
    for f in files:
        d = os.path.dirname(f)
        while d not in ("/", ""):
            dirs.add(d)
            d = os.path.dirname(d)
    tmp = out + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.GNU_FORMAT) as tar:
        def entry(name, **kw):
            info = tarfile.TarInfo(name)
            for k, v in kw.items():
                setattr(info, k, v)
            tar.addfile(info)
        for d in sorted(dirs):
            entry(d.lstrip("/"), type=tarfile.DIRTYPE, mode=0o1777 if d.endswith("tmp") else 0o755)
        for link, target in [("bin", "usr/bin"), ("sbin", "usr/sbin"), ("lib", "usr/lib"),
                             ("lib64", "usr/lib64")]:
            entry(link, type=tarfile.SYMTYPE, linkname=target, mode=0o777)
        for name, text in [("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
                           ("etc/group", "root:x:0:\n")]:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
        links = {"/bin", "/sbin", "/lib", "/lib64"}
        for f in sorted(files - dirs - links):
            if f in ("/etc/passwd", "/etc/group"):
                continue
            tar.add(f, arcname=f.lstrip("/"), recursive=False)
    os.replace(tmp, out)
    print(f"{out}: {len(files)} files of {len(closure(ROOTS))} packages")


if __name__ == "__main__":
    main()
