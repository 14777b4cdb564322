"""gpucap from Python: cap the GPU memory of the programs you start.

``pip install gpucap`` installs the ``gpucap`` command (a native executable) and this
package, which holds ``libgpucap.so``, the ``LD_PRELOAD`` shim that does the capping.
This module imports no CUDA library and never loads the shim itself: it finds the
library, builds capped environments for :mod:`subprocess`, reads pools, and runs the
command (``python -m gpucap ...`` is ``gpucap ...``).

>>> import subprocess, gpucap
>>> subprocess.run(["python", "train.py"], env=gpucap.env(limit="8Gi"))  # doctest: +SKIP

Every configuration is validated by ``gpucap check``, the command's own validation;
an invalid one raises :class:`GpucapError` with gpucap's message.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Sequence, Union

__all__ = [
    "GpucapError",
    "__version__",
    "env",
    "executable",
    "library_path",
    "main",
    "merge_ld_preload",
    "status",
]

__version__ = "0.1.0"
"""This package's version, which is also its ``gpucap`` command's (``gpucap --version``)."""

LIB_NAME = "libgpucap.so"
"""The shim's file name."""

_PACKAGE_DIR = Path(__file__).resolve().parent

# What `gpucap run --growth` also sets, unless already set (src/cli/args/mod.rs,
# FRAMEWORK_GROWTH_VARS): the frameworks' own grow-on-demand switches.
_FRAMEWORK_GROWTH_VARS = (
    ("TF_FORCE_GPU_ALLOW_GROWTH", "true"),
    ("XLA_PYTHON_CLIENT_PREALLOCATE", "false"),
)


class GpucapError(Exception):
    """gpucap refused a configuration or a command failed.

    ``str(error)`` is gpucap's own message (its ``gpucap: ...`` lines);
    ``returncode`` is the command's exit status (2 for a configuration error), or
    ``None`` when the command could not be run at all.
    """

    def __init__(self, message: str, returncode: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.returncode = returncode


def library_path() -> Path:
    """The absolute path of ``libgpucap.so`` in this package.

    Raises :class:`GpucapError` if the package holds none (a source checkout that
    was not built with ``scripts/build-wheel.sh``).
    """
    lib = _PACKAGE_DIR / LIB_NAME
    if not lib.is_file():
        raise GpucapError(
            f"cannot find {LIB_NAME}: {lib} does not exist (install gpucap with pip, "
            "or build the wheel with scripts/build-wheel.sh)"
        )
    return lib


def _record_hash_matches(path: Path, hash_: Any, size: Optional[int]) -> bool:
    """Whether the file at ``path`` is the one pip recorded (its size and sha256)."""
    try:
        if size is not None and path.stat().st_size != size:
            return False
        if getattr(hash_, "mode", None) != "sha256":
            return False
        digest = hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return False
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == str(hash_.value)


def _version_of(path: str) -> Optional[str]:
    """What ``path --version`` says, or None if it cannot be run."""
    try:
        proc = subprocess.run(
            [path, "--version"], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _installed_command() -> Optional[str]:
    """The ``gpucap`` pip installed with this package, as its installation record says
    (and is: the file's size and sha256 are the record's), or None."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution
    except ImportError:  # pragma: no cover (Python < 3.8)
        return None
    try:
        dist = distribution("gpucap")
    except PackageNotFoundError:
        return None
    files = dist.files or []
    # The record must be this package's (another gpucap may come first on sys.path).
    ours = [f for f in files if f.parts == ("gpucap", "__init__.py")]
    if not ours or Path(str(ours[0].locate())).resolve() != Path(__file__).resolve():
        return None
    for f in files:
        if f.parts[-2:] != ("bin", "gpucap"):
            continue
        # pip install --target DIR records `../../bin/gpucap` (relative to the scheme it
        # installed into before moving it all to DIR): the command is DIR/bin/gpucap.
        root = Path(str(dist.locate_file("")))
        for path in (Path(str(f.locate())), root / "bin" / "gpucap"):
            path = path.resolve()
            if not (path.is_file() and os.access(path, os.X_OK)):
                continue
            if f.hash is not None:
                if _record_hash_matches(path, f.hash, f.size):
                    return str(path)
            elif _version_of(str(path)) == f"gpucap {__version__}":
                return str(path)
    return None


def executable() -> str:
    """The path of the ``gpucap`` command installed with this package.

    pip puts it in the scripts directory of the scheme it installed into (the venv's
    ``bin/``, ``~/.local/bin`` for ``--user``, ``DIR/bin`` for ``--target DIR``); the
    package's installation record says which, and the file found must be the one
    recorded. Without one, the ``gpucap`` on ``PATH`` is used if it is this package's
    version (``gpucap --version``); another version raises :class:`GpucapError`. (No
    ``GPUCAP_*`` variable overrides it: gpucap refuses unknown ones.)
    """
    installed = _installed_command()
    if installed is not None:
        return installed
    found = shutil.which("gpucap")
    if found is None:
        raise GpucapError(
            "cannot find the gpucap command: it is not where this package's installation "
            "record puts it nor on PATH"
        )
    said = _version_of(found)
    if said != f"gpucap {__version__}":
        raise GpucapError(
            f"the gpucap on PATH ({found}) is not this package's: it says "
            f"{said or 'nothing'} to --version, this package is gpucap {__version__} "
            f"({_PACKAGE_DIR}); install the package with pip, or put its gpucap first on PATH"
        )
    return found


def _preload_entries(value: str) -> List[str]:
    """The entries of an LD_PRELOAD value: the loader splits on spaces and colons."""
    return [e for e in value.replace("\t", " ").replace("\n", " ").replace(":", " ").split(" ") if e]


def merge_ld_preload(existing: Optional[str], lib: Union[str, Path]) -> str:
    """``existing`` (an ``LD_PRELOAD`` value) with ``lib`` appended, as ``gpucap run``
    does: the user's preloads come first and are kept as written, and a value that
    already loads ``lib`` (the same path or the same file) is returned unchanged."""
    lib = str(lib)
    if existing is None or not _preload_entries(existing):
        return lib
    for entry in _preload_entries(existing):
        if entry == lib:
            return existing
        try:
            if os.path.samefile(entry, lib):
                return existing
        except OSError:
            pass
    sep = "" if existing.endswith((" ", ":")) else ":"
    return existing + sep + lib


def _run(args: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> "subprocess.CompletedProcess[str]":
    """Runs the gpucap command with ``args``; its output captured as text."""
    exe = executable()
    try:
        return subprocess.run(
            [exe, *args],
            env=dict(environ) if environ is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            check=False,
        )
    except OSError as e:
        raise GpucapError(f"cannot run {exe}: {e}") from e


def _failure(proc: "subprocess.CompletedProcess[str]") -> GpucapError:
    """A failed command's error: its gpucap lines, else all it wrote."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gpucap")]
    message = "\n".join(lines) if lines else (proc.stderr or proc.stdout).strip()
    return GpucapError(message or f"gpucap exited with status {proc.returncode}", proc.returncode)


def _spec(value: Union[str, int, float, None], what: str) -> Optional[str]:
    """A cap's value as gpucap reads it: a string as given, an int as bytes, a float as
    a fraction of the GPU."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise TypeError(f"{what}: a size string ('8Gi'), whole bytes (int) or a fraction (float), not a bool")
    if isinstance(value, (int, float)):
        return repr(value)
    raise TypeError(f"{what}: a size string ('8Gi'), whole bytes (int) or a fraction (float), not {type(value).__name__}")


def env(
    limit: Union[str, int, float, None] = None,
    pool: Optional[str] = None,
    guarantee: Union[str, int, float, None] = None,
    ceiling: Union[str, int, float, None] = None,
    base: Optional[Mapping[str, str]] = None,
    *,
    wait: Optional[str] = None,
    growth: bool = False,
    log: Optional[str] = None,
    report: Optional[str] = None,
) -> Dict[str, str]:
    """An environment for :mod:`subprocess` whose programs are capped.

    ``base`` (default: this process's environment) with the ``GPUCAP_*`` variables of
    the arguments set and ``libgpucap.so`` appended to ``LD_PRELOAD``, exactly as
    ``gpucap run --limit ... --pool ...`` would give its command. Arguments left at
    ``None`` keep ``base``'s variable, if any. ``limit``, ``guarantee`` and ``ceiling``
    take gpucap's specs (``"8Gi"``, ``"50%"``, ``"0=8Gi,1=4Gi"``), whole bytes as an
    ``int`` or a fraction of the GPU as a ``float``.

    The result is validated by ``gpucap check`` before it is returned: a
    configuration gpucap would refuse raises :class:`GpucapError` with gpucap's
    message (nothing is started uncapped).
    """
    result: Dict[str, str] = dict(os.environ if base is None else base)
    settings = {
        "GPUCAP_LIMIT": _spec(limit, "limit"),
        "GPUCAP_POOL": pool,
        "GPUCAP_GUARANTEE": _spec(guarantee, "guarantee"),
        "GPUCAP_CEILING": _spec(ceiling, "ceiling"),
        "GPUCAP_WAIT": wait,
        "GPUCAP_LOG": log,
        "GPUCAP_REPORT": report,
        "GPUCAP_GROWTH": "1" if growth else None,
    }
    for name, value in settings.items():
        if value is not None:
            result[name] = value
    if growth:
        for name, value in _FRAMEWORK_GROWTH_VARS:
            result.setdefault(name, value)
    # gpucap check finds the library as gpucap run does; GPUCAP_LIB, if set, names it.
    lib = result.get("GPUCAP_LIB") or str(library_path())
    proc = _run(["check"], result)
    if proc.returncode != 0:
        raise _failure(proc)
    result["LD_PRELOAD"] = merge_ld_preload(result.get("LD_PRELOAD"), lib)
    return result


def status(pool: Optional[str] = None) -> Dict[str, Any]:
    """A pool's state, from ``gpucap status --json``: per GPU its cap, use and peak,
    per process its use (see docs/src/pools.md for the fields).

    ``pool`` names it (a name or an absolute path); ``None`` reads the pool this
    process's environment names (``GPUCAP_POOL``). Raises :class:`GpucapError` if
    there is no such pool or it cannot be read.
    """
    args = ["status", "--json"]
    if pool is not None:
        args += ["--pool", pool]
    proc = _run(args)
    if proc.returncode != 0:
        raise _failure(proc)
    try:
        parsed = json.loads(proc.stdout)
    except ValueError as e:
        raise GpucapError(f"gpucap status --json printed no JSON ({e}): {proc.stdout[:200]!r}") from e
    if not isinstance(parsed, dict):
        raise GpucapError(f"gpucap status --json printed {type(parsed).__name__}, not an object")
    return parsed


def main(argv: Optional[Sequence[str]] = None) -> NoReturn:
    """``python -m gpucap ARGS``: becomes ``gpucap ARGS`` (the same process, so the
    exit status and signals are the command's)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        exe = executable()
    except GpucapError as e:
        print(f"gpucap: {e}", file=sys.stderr)
        sys.exit(2)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(exe, [exe, *args])
    except OSError as e:
        print(f"gpucap: cannot run {exe}: {e}", file=sys.stderr)
        sys.exit(126)
