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

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Sequence, Union

__all__ = [
    "GpucapError",
    "env",
    "executable",
    "library_path",
    "main",
    "merge_ld_preload",
    "status",
]

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


def executable() -> str:
    """The path of the ``gpucap`` command installed with this package.

    pip puts it in the scripts directory of the scheme it installed into (the venv's
    ``bin/``, ``~/.local/bin`` for ``--user``, ``DIR/bin`` for ``--target DIR``); the
    package's installation record says which. Without a record, the ``gpucap`` on
    ``PATH`` is used. (No ``GPUCAP_*`` variable overrides it: gpucap refuses unknown ones.)
    """
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        try:
            files = distribution("gpucap").files or []
        except PackageNotFoundError:
            files = []
        for f in files:
            if f.parts[-2:] == ("bin", "gpucap"):
                path = Path(str(f.locate())).resolve()
                if path.is_file() and os.access(path, os.X_OK):
                    return str(path)
    except ImportError:  # pragma: no cover (Python < 3.8)
        pass
    found = shutil.which("gpucap")
    if found is None:
        raise GpucapError(
            "cannot find the gpucap command: it is not in this package's installation "
            "record nor on PATH"
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
