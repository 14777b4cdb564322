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
import decimal
import hashlib
import json
import math
import numbers
import operator
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Sequence, Union

__all__ = [
    "LIB_NAME",
    "GpucapError",
    "GpucapWarning",
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

# gpucap run's flags and the variables they set (src/core/config/typed.rs, FLAG_VARS).
_FLAG_VARS = {
    "--limit": "GPUCAP_LIMIT",
    "--log": "GPUCAP_LOG",
    "--report": "GPUCAP_REPORT",
    "--growth": "GPUCAP_GROWTH",
    "--pool": "GPUCAP_POOL",
    "--wait": "GPUCAP_WAIT",
    "--guarantee": "GPUCAP_GUARANTEE",
    "--ceiling": "GPUCAP_CEILING",
}

StrPath = Union[str, "os.PathLike[str]"]
Size = Union[str, int, float, None]


class GpucapError(Exception):
    """gpucap refused a configuration or a command failed.

    ``str(error)`` (also ``error.message``) is the message: gpucap's own lines
    (``gpucap: ...``), prefixed with the arguments of :func:`env` whose variables they
    name (``limit='8Gx': gpucap: GPUCAP_LIMIT="8Gx": unknown unit ...``).
    ``returncode`` is the command's exit status (2 for a configuration error), or
    ``None`` when no command ran (an argument of the wrong type, the command not found).
    """

    def __init__(self, message: str, returncode: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.returncode = returncode


class GpucapWarning(UserWarning):
    """A warning ``gpucap check`` printed about a configuration it accepted (no NVIDIA
    driver here, a pool directory that does not exist, ...): :func:`env` passes each of
    its lines on with :func:`warnings.warn`."""


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


def _failure(proc: "subprocess.CompletedProcess[str]", named: Optional[Mapping[str, str]] = None) -> GpucapError:
    """A failed command's error: its gpucap lines, else all it wrote. ``named`` maps the
    variables :func:`env`'s arguments set to ``arg='value'``: the message is prefixed
    with those of the variables it names (``limit='8Gx': gpucap: ...``)."""
    lines = [line for line in proc.stderr.splitlines() if line.startswith("gpucap")]
    message = "\n".join(lines) if lines else (proc.stderr or proc.stdout).strip()
    message = message or f"gpucap exited with status {proc.returncode}"
    args = [arg for var, arg in (named or {}).items() if var in message]
    if args:
        message = f"{', '.join(args)}: {message}"
    return GpucapError(message, proc.returncode)


def _spec(value: Size, arg: str) -> Optional[str]:
    """A cap's value as gpucap reads it: a string as given, an integer as whole bytes, a
    real number as a fraction (written with a point, never an exponent)."""
    of = "the GPU's memory" if arg == "limit" else "the pool's cap"
    accepts = f"a size string ('8Gi', '50%', '0=8Gi,1=4Gi'), whole bytes (an int) or a fraction of {of} (a float)"
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise GpucapError(f"{arg}={value!r}: a bool is not a size; {arg} takes {accepts}")
    if isinstance(value, numbers.Integral):
        return str(operator.index(value))
    if isinstance(value, numbers.Real):
        f = float(value)
        if not (math.isfinite(f) and 0 < f <= 1):
            raise GpucapError(
                f"{arg}={value!r}: a float is a fraction of {of}, above 0 and at most 1 "
                f"(bytes are an int, more a size string such as '8Gi')"
            )
        text = format(decimal.Decimal(repr(f)), "f")
        return text if "." in text else text + ".0"
    raise GpucapError(f"{arg}={value!r}: {arg} takes {accepts}, not {type(value).__name__}")


def _text(value: Union[str, "os.PathLike[str]", None], arg: str, accepts: str, path: bool = False) -> Optional[str]:
    """A string option as given (an ``os.PathLike`` too where ``path``), else GpucapError."""
    if path and isinstance(value, os.PathLike):
        value = os.fspath(value)
    if value is None or isinstance(value, str):
        return value
    raise GpucapError(f"{arg}={value!r}: {arg} takes {accepts}, not {type(value).__name__}")


def _without_gpucap(ld_preload: Optional[str]) -> Optional[str]:
    """An LD_PRELOAD value without its libgpucap.so entries (by file name, as gpucap
    check tells one), the others kept in order; None if none is left."""
    if ld_preload is None:
        return None
    kept = [e for e in _preload_entries(ld_preload) if os.path.basename(e) != LIB_NAME]
    return ":".join(kept) if kept else None


def _uncapped(report: str, environ: Mapping[str, str]) -> bool:
    """Whether ``gpucap check``'s report says no cap from any source, where the
    environment did not set ``GPUCAP_LIMIT=none`` on purpose: `gpucap run`'s rule
    (src/cli/commands/run.rs, uncapped_line) as check reports it. A cap is a limit
    (``limit:`` other than ``none``: the environment's, a driver's grant, a
    ``gpucap.env``'s, or a ceiling of one) or this process's ceiling in its pool."""
    if environ.get("GPUCAP_LIMIT", "").strip().lower() == "none":
        return False
    lines = report.splitlines()
    if any(line.startswith("ceiling: ") for line in lines):
        return False
    return any(line.startswith("limit: none") for line in lines)


def env(
    limit: Size = None,
    pool: Optional[StrPath] = None,
    guarantee: Size = None,
    ceiling: Size = None,
    base: Optional[Mapping[str, str]] = None,
    *,
    wait: Optional[str] = None,
    growth: bool = False,
    log: Optional[str] = None,
    report: Optional[StrPath] = None,
) -> Dict[str, str]:
    """An environment for :mod:`subprocess` whose programs are capped.

    ``base`` (default: this process's environment) with the ``GPUCAP_*`` variables of
    the arguments set and ``libgpucap.so`` appended to ``LD_PRELOAD``, exactly as
    ``gpucap run --limit ... --pool ...`` would give its command. Arguments left at
    ``None`` keep ``base``'s variable, if any. ``limit``, ``guarantee`` and ``ceiling``
    take gpucap's specs (``"8Gi"``, ``"50%"``, ``"0=8Gi,1=4Gi"``), whole bytes as an
    integer (``int``, ``numpy.int64``) or a fraction of the GPU (of the pool's cap for
    ``guarantee`` and ``ceiling``) as a real number above 0 and at most 1 (``0.5``).
    ``pool`` is a name, or the pool file's absolute path (``str`` or ``os.PathLike``);
    ``report`` a path (``str`` or ``os.PathLike``), made absolute against the current
    directory; ``wait`` a duration (``"30s"``); ``log`` a level (``"info"``).

    The result is validated by ``gpucap check`` (run with no ``libgpucap.so`` in its
    ``LD_PRELOAD``, so that inside a capped process it still sees the GPUs) before it
    is returned: a configuration gpucap would refuse raises :class:`GpucapError` with
    gpucap's message (prefixed with the arguments it is about), and so does one with no cap from any source (no ``limit``, no
    ``ceiling``, no driver's grant or ``gpucap.env`` with a cap): nothing is started
    uncapped unless ``limit="none"`` asks for it. ``LD_PRELOAD`` gets the absolute path
    of the library ``gpucap check`` validated (``GPUCAP_LIB``'s, made absolute, if set).
    Warnings ``gpucap check`` prints are passed on as :class:`GpucapWarning`.
    """
    result: Dict[str, str] = dict(os.environ if base is None else base)
    if not isinstance(growth, bool):
        raise GpucapError(f"growth={growth!r}: growth takes True or False, not {type(growth).__name__}")
    report = _text(report, "report", "a path (str or os.PathLike)", path=True)
    if report:
        report = os.path.join(os.getcwd(), report)
    settings = {
        "GPUCAP_LIMIT": ("limit", _spec(limit, "limit")),
        "GPUCAP_POOL": ("pool", _text(pool, "pool", "a pool name or the pool file's absolute path", path=True)),
        "GPUCAP_GUARANTEE": ("guarantee", _spec(guarantee, "guarantee")),
        "GPUCAP_CEILING": ("ceiling", _spec(ceiling, "ceiling")),
        "GPUCAP_WAIT": ("wait", _text(wait, "wait", "a duration string ('500ms', '30s', '5m', '1h', '0')")),
        "GPUCAP_LOG": ("log", _text(log, "log", "a level string ('off', 'error', 'warn', 'info', 'debug')")),
        "GPUCAP_REPORT": ("report", report),
        "GPUCAP_GROWTH": ("growth", "1" if growth else None),
    }
    named: Dict[str, str] = {}
    for var, (arg, value) in settings.items():
        if value is not None:
            result[var] = value
            named[var] = f"{arg}={value!r}"
    if growth:
        for var, value in _FRAMEWORK_GROWTH_VARS:
            result.setdefault(var, value)
    # An outer `gpucap run --limit` named its flags in GPUCAP_TYPED (each `--flag` or
    # `--flag@<digest of its value>`): a variable set here is no longer the flag's.
    if "GPUCAP_TYPED" in result:
        kept = [f.strip() for f in result["GPUCAP_TYPED"].split(",") if f.strip()]
        kept = [f for f in kept if _FLAG_VARS.get(f.split("@")[0]) not in named]
        if kept:
            result["GPUCAP_TYPED"] = ",".join(kept)
        else:
            del result["GPUCAP_TYPED"]
    # gpucap check, run as a program of this environment would be, less the shim (which
    # would refuse check's own cuInit in a capped process) and GPUCAP_TYPED (its lines
    # name the variables, which are the arguments' here).
    check_env = {k: v for k, v in result.items() if k not in ("LD_PRELOAD", "GPUCAP_TYPED")}
    others = _without_gpucap(result.get("LD_PRELOAD"))
    if others is not None:
        check_env["LD_PRELOAD"] = others
    proc = _run(["check"], check_env)
    if proc.returncode != 0:
        raise _failure(proc, named)
    libs = [line[len("library: ") :] for line in proc.stdout.splitlines() if line.startswith("library: /")]
    if len(libs) != 1:
        raise GpucapError(f"gpucap check named no library:\n{proc.stdout}")
    if _uncapped(proc.stdout, result):
        raise GpucapError(
            "gpucap.env(): no cap is set (no limit= or ceiling= given, and no GPUCAP_LIMIT, "
            "GPUCAP_CEILING, driver's grant or gpucap.env with a cap: gpucap check says "
            '"limit: none"), so the programs started with this environment would run '
            'uncapped: give limit= (limit="8Gi", limit=0.5, limit=8 << 30), or ceiling= with '
            'a pool; limit="none" runs them uncapped on purpose'
        )
    for line in proc.stderr.splitlines():
        if line.strip():
            warnings.warn(line, GpucapWarning, stacklevel=2)
    if "GPUCAP_LIB" in result:
        result["GPUCAP_LIB"] = libs[0]
    result["LD_PRELOAD"] = merge_ld_preload(result.get("LD_PRELOAD"), libs[0])
    return result


def status(pool: Optional[StrPath] = None) -> Dict[str, Any]:
    """``gpucap status --json`` as Python objects; which of two shapes depends on
    whether a pool is named.

    With a pool (``pool``: a name or the pool file's absolute path; with ``None``, the
    pool this process's environment names, ``GPUCAP_POOL``, else the one a
    ``gpucap.env`` names): that pool, ``{"path", "version", "created", "gpus": [{"cap",
    "used", "peak", ...}], "members": [...]}`` (docs/src/pools.md lists the fields).
    Raises :class:`GpucapError` if there is no such pool or it cannot be read.

    With ``pool=None`` and no pool named anywhere: every capped process of the machine,
    ``{"processes": [...], "pools": [...], "lone": [...], "errors": [...], "warnings": [...]}``
    (docs/src/watching.md lists the fields).
    """
    args = ["status", "--json"]
    name = _text(pool, "pool", "a pool name or the pool file's absolute path", path=True)
    if name is not None:
        args += ["--pool", name]
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
    """What ``python -m gpucap ARGS`` runs: **replaces this process** with ``gpucap
    ARGS`` (``os.execv``; it never returns), so the exit status and signals are the
    command's. ``argv`` defaults to ``sys.argv[1:]``. Not for use inside a program
    that must go on: run :func:`executable` with :mod:`subprocess` instead."""
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
