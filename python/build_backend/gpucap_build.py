"""The build backend of the gpucap wheel: maturin's, with the shim built first.

maturin builds one crate, the `gpucap` command (src/cli). The shim, libgpucap.so, is
another crate (src/shim) of the same workspace; the wheel carries it in the Python
package (gpucap/libgpucap.so). So that `pip install ./python` (from a checkout) and
`pip install gpucap-<version>.tar.gz` (the sdist) give a working command, this backend
builds the shim with cargo, copies it into the package, then hands over to maturin.
`build_sdist` adds the shim's source to maturin's sdist, so the sdist builds it too.

CARGO_TARGET_DIR is honoured (the shim is taken from $CARGO_TARGET_DIR/release).
"""

import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import maturin
from maturin import (  # noqa: F401  (the hooks maturin answers as it is)
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
    prepare_metadata_for_build_wheel,
)

SHIM_CRATE = Path("src") / "shim"


def _fail(message):
    sys.stderr.write(f"gpucap build: {message}\n")
    raise SystemExit(1)


def _workspace(project):
    """The folder of the Cargo workspace that holds the shim's crate: the checkout's root
    (the project is its python/ folder) or the unpacked sdist itself."""
    for d in (project, *project.parents):
        if (d / "Cargo.toml").is_file() and (d / SHIM_CRATE / "Cargo.toml").is_file():
            return d
    _fail(
        f"the shim's source ({SHIM_CRATE}/Cargo.toml) is not in {project} or a folder above it: "
        "build from a checkout of gpucap (pip install ./python) or from its sdist"
    )


def _build_shim():
    project = Path.cwd()
    root = _workspace(project)
    cargo = shutil.which("cargo")
    if cargo is None:
        _fail("cargo is not on PATH: building the shim (libgpucap.so) needs Rust 1.89+ (https://rustup.rs)")
    target = Path(os.environ.get("CARGO_TARGET_DIR") or root / "target")
    env = {**os.environ, "CARGO_TARGET_DIR": str(target)}
    cmd = [cargo, "build", "--release", "-p", "gpucap-shim", "--manifest-path", str(root / "Cargo.toml")]
    sys.stderr.write("gpucap build: " + " ".join(cmd) + "\n")
    if subprocess.run(cmd, env=env, stdout=sys.stderr).returncode != 0:
        _fail("cargo could not build the shim (libgpucap.so); its messages are above")
    built = target / "release" / "libgpucap.so"
    if not built.is_file():
        _fail(f"cargo built no {built}")
    dest = project / "gpucap" / "libgpucap.so"
    shutil.copyfile(built, dest)
    dest.chmod(0o755)
    # The repository's release profile keeps debug information; the wheel does not.
    if shutil.which("strip"):
        subprocess.run(["strip", "--strip-debug", str(dest)], check=False)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _build_shim()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _build_shim()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)


def _add_to_sdist(path, root, project):
    """Rewrites maturin's sdist at `path` with the shim's crate (and this backend) in it,
    and the shim a member of its workspace."""
    with tarfile.open(path, "r:gz") as old:
        members = [(m, old.extractfile(m).read() if m.isfile() else None) for m in old.getmembers()]
    top = members[0][0].name.split("/")[0]
    names = {m.name for m, _ in members}
    rewritten = []
    for m, data in members:
        if m.name == f"{top}/Cargo.toml":
            text = data.decode()
            members_line = next((l for l in text.splitlines() if l.startswith("members = [")), None)
            if members_line is None:
                _fail(f"maturin's sdist has no workspace members line in {m.name}")
            if '"src/shim"' not in members_line:
                text = text.replace(members_line, members_line.replace("members = [", 'members = ["src/shim", ', 1))
            data = text.encode()
            m.size = len(data)
        rewritten.append((m, data))

    def add(src, arcname):
        if arcname in names:
            return
        info = tarfile.TarInfo(arcname)
        data = src.read_bytes()
        info.size = len(data)
        info.mode = src.stat().st_mode & 0o777
        rewritten.append((info, data))

    for f in sorted((root / SHIM_CRATE).rglob("*")):
        if f.is_file() and "target" not in f.relative_to(root).parts:
            add(f, f"{top}/{f.relative_to(root).as_posix()}")
    for f in sorted((project / "build_backend").glob("*.py")):
        add(f, f"{top}/build_backend/{f.name}")
    with tarfile.open(path, "w:gz") as new:
        for m, data in rewritten:
            new.addfile(m, io.BytesIO(data) if data is not None else None)


def build_sdist(sdist_directory, config_settings=None):
    name = maturin.build_sdist(sdist_directory, config_settings)
    project = Path.cwd()
    _add_to_sdist(Path(sdist_directory) / name, _workspace(project), project)
    return name
