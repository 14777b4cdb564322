"""Unit tests of the gpucap Python module, run by tests/deployment/wheel.rs with the Python of a
fresh venv the wheel was installed into (scripts/test.sh):

    VENV/bin/python -m unittest discover -s python/tests -v

They run the installed ``gpucap`` command. With ``WHEEL_TEST_FAKE_LIBDIR`` (the fake
GPU's libcuda) and ``WHEEL_TEST_CLIENT`` (target/release/cudarc-client) set, they also
run a capped program on the fake GPU; without, those tests are skipped.
"""

from __future__ import annotations

import fractions
import numbers
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import warnings
from pathlib import Path
from typing import Iterator
from unittest import mock

import gpucap


def clean_environ() -> dict:
    """This process's environment without gpucap's, the fake GPU's or LD_PRELOAD."""
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUCAP_", "FAKECUDA_", "CUDA_DEVICE_MEMORY_")) and k != "LD_PRELOAD"
    }


class InDirectory:
    """A context manager: the current directory is a fresh temporary one, then back."""

    def __enter__(self) -> Path:
        self.old = os.getcwd()
        self.tmp = tempfile.TemporaryDirectory()
        d = Path(self.tmp.name).resolve()
        os.chdir(d)
        return d

    def __exit__(self, *exc: object) -> None:
        os.chdir(self.old)
        self.tmp.cleanup()


class NpFloat(float):
    """A float subclass whose repr is not a number, as numpy's float64 is."""

    def __repr__(self) -> str:
        return f"np.float64({float(self)!r})"


class NpInt:
    """An integer that is not an int, as numpy's int64 is: numbers.Integral, __index__."""

    def __init__(self, v: int) -> None:
        self.v = v

    def __index__(self) -> int:
        return self.v

    def __repr__(self) -> str:
        return f"np.int64({self.v})"


numbers.Integral.register(NpInt)


class LibraryPath(unittest.TestCase):
    def test_is_the_shim_in_the_package(self) -> None:
        lib = gpucap.library_path()
        self.assertTrue(lib.is_absolute())
        self.assertTrue(lib.is_file())
        self.assertEqual(lib.name, "libgpucap.so")
        self.assertEqual(lib.parent, Path(gpucap.__file__).resolve().parent)
        with open(lib, "rb") as f:
            self.assertEqual(f.read(4), b"\x7fELF")

    def test_the_command_finds_the_same_library(self) -> None:
        out = subprocess.run(
            [gpucap.executable(), "check"], env=clean_environ(), capture_output=True, text=True, check=True
        ).stdout
        self.assertIn(f"library: {gpucap.library_path()}\n", out)


class MergeLdPreload(unittest.TestCase):
    def test_merging(self) -> None:
        lib = "/opt/gpucap/libgpucap.so"
        m = gpucap.merge_ld_preload
        self.assertEqual(m(None, lib), lib)
        self.assertEqual(m("", lib), lib)
        self.assertEqual(m("  ", lib), lib)
        self.assertEqual(m("/a.so", lib), f"/a.so:{lib}")
        self.assertEqual(m("/a.so /b.so", lib), f"/a.so /b.so:{lib}")
        self.assertEqual(m("/a.so:", lib), f"/a.so:{lib}")
        self.assertEqual(m("/a.so ", lib), f"/a.so {lib}")
        self.assertEqual(m(f"{lib}:/a.so", lib), f"{lib}:/a.so")
        self.assertEqual(m("/elsewhere/libgpucap.so", lib), f"/elsewhere/libgpucap.so:{lib}")

    def test_the_same_file_by_another_path(self) -> None:
        with tempfile.TemporaryDirectory() as d:
            real = Path(d, "real")
            real.mkdir()
            (real / "libgpucap.so").write_bytes(b"")
            Path(d, "link").symlink_to(real)
            via_link = str(Path(d, "link", "libgpucap.so"))
            self.assertEqual(gpucap.merge_ld_preload(via_link, real / "libgpucap.so"), via_link)


class Env(unittest.TestCase):
    def test_sets_the_variables_and_preloads_the_library(self) -> None:
        base = clean_environ()
        base["LD_PRELOAD"] = "/usr/lib/other.so"
        e = gpucap.env(limit="1Gi", pool="team", guarantee="256Mi", ceiling=0.5, base=base)
        self.assertEqual(e["GPUCAP_LIMIT"], "1Gi")
        self.assertEqual(e["GPUCAP_POOL"], "team")
        self.assertEqual(e["GPUCAP_GUARANTEE"], "256Mi")
        self.assertEqual(e["GPUCAP_CEILING"], "0.5")
        self.assertEqual(e["LD_PRELOAD"], f"/usr/lib/other.so:{gpucap.library_path()}")
        self.assertEqual(e["PATH"], base["PATH"])
        # base is not modified
        self.assertNotIn("GPUCAP_LIMIT", base)

    def test_whole_bytes_and_growth(self) -> None:
        e = gpucap.env(limit=2 << 30, growth=True, base=clean_environ())
        self.assertEqual(e["GPUCAP_LIMIT"], str(2 << 30))
        self.assertEqual(e["GPUCAP_GROWTH"], "1")
        self.assertEqual(e["TF_FORCE_GPU_ALLOW_GROWTH"], "true")

    def test_an_invalid_limit_raises_with_gpucaps_message(self) -> None:
        with self.assertRaises(gpucap.GpucapError) as caught:
            gpucap.env(limit="8Gx", base=clean_environ())
        self.assertEqual(caught.exception.returncode, 2)
        self.assertIn('unknown unit "Gx"', str(caught.exception))
        self.assertTrue(str(caught.exception).startswith("limit='8Gx': gpucap: "), str(caught.exception))

    def test_a_guarantee_above_the_ceiling_raises(self) -> None:
        with self.assertRaises(gpucap.GpucapError) as caught:
            gpucap.env(limit="4Gi", pool="p", guarantee="2Gi", ceiling="1Gi", base=clean_environ())
        self.assertIn("GPUCAP_GUARANTEE", str(caught.exception))
        self.assertTrue(str(caught.exception).startswith("guarantee='2Gi', ceiling='1Gi': gpucap: "))

    def test_an_unknown_gpucap_variable_in_base_raises(self) -> None:
        base = clean_environ()
        base["GPUCAP_LIMT"] = "1Gi"
        with self.assertRaises(gpucap.GpucapError) as caught:
            gpucap.env(limit="1Gi", base=base)
        self.assertIn("GPUCAP_LIMT", str(caught.exception))

    def test_a_bool_is_not_a_size(self) -> None:
        with self.assertRaises(gpucap.GpucapError) as caught:
            gpucap.env(limit=True, base=clean_environ())
        self.assertIn("limit=True: a bool is not a size", str(caught.exception))
        self.assertIsNone(caught.exception.returncode)

    def test_numbers_are_written_as_gpucap_reads_them(self) -> None:
        base = clean_environ()
        for value, written in [
            (NpFloat(0.25), "0.25"),
            (5e-05, "0.00005"),
            (1.0, "1.0"),
            (fractions.Fraction(1, 4), "0.25"),
            (NpInt(2 << 30), str(2 << 30)),
        ]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", gpucap.GpucapWarning)
                e = gpucap.env(limit=value, pool="p", ceiling=value, base=base)
            self.assertEqual((e["GPUCAP_LIMIT"], e["GPUCAP_CEILING"]), (written, written), repr(value))
        for value in [2.0, 0.0, -0.5, float("nan"), float("inf")]:
            with self.assertRaises(gpucap.GpucapError) as caught:
                gpucap.env(limit=value, base=base)
            self.assertIn("a float is a fraction of the GPU's memory", str(caught.exception))
        with self.assertRaises(gpucap.GpucapError) as caught:
            gpucap.env(limit=[1], base=base)
        self.assertIn("limit=[1]: limit takes a size string", str(caught.exception))

    def test_other_options_of_the_wrong_type_name_the_argument(self) -> None:
        base = clean_environ()
        for kwargs, said in [
            ({"wait": 30}, "wait=30: wait takes a duration string"),
            ({"log": 1}, "log=1: log takes a level string"),
            ({"pool": 5}, "pool=5: pool takes a pool name"),
            ({"report": 5}, "report=5: report takes a path"),
            ({"growth": "yes"}, "growth='yes': growth takes True or False"),
        ]:
            with self.assertRaises(gpucap.GpucapError) as caught:
                gpucap.env(limit="1Gi", base=base, **kwargs)  # type: ignore[arg-type]
            self.assertIn(said, str(caught.exception))
            self.assertIsNone(caught.exception.returncode)

    def test_a_relative_report_is_made_absolute(self) -> None:
        with InDirectory() as d:
            e = gpucap.env(limit="1Gi", report="out/r-%p.json", base=clean_environ())
            self.assertEqual(e["GPUCAP_REPORT"], str(d / "out" / "r-%p.json"))
            e = gpucap.env(limit="1Gi", report="/abs/r.json", base=clean_environ())
            self.assertEqual(e["GPUCAP_REPORT"], "/abs/r.json")

    def test_paths_are_taken(self) -> None:
        with InDirectory() as d:
            pool = d / "team.pool"
            e = gpucap.env(limit="1Gi", pool=pool, report=Path("usage.json"), base=clean_environ())
            self.assertEqual(e["GPUCAP_POOL"], str(pool))
            self.assertEqual(e["GPUCAP_REPORT"], str(d / "usage.json"))

    def test_a_relative_gpucap_lib_is_made_absolute(self) -> None:
        with InDirectory() as d:
            shutil.copyfile(gpucap.library_path(), d / "libgpucap.so")
            (d / "sub").mkdir()
            for cwd, lib in [(d, "libgpucap.so"), (d, "./libgpucap.so"), (d / "sub", "../libgpucap.so")]:
                os.chdir(cwd)
                base = clean_environ()
                base["GPUCAP_LIB"] = lib
                e = gpucap.env(limit="1Gi", base=base)
                self.assertEqual(e["LD_PRELOAD"], str(d / "libgpucap.so"), lib)
                self.assertEqual(e["GPUCAP_LIB"], str(d / "libgpucap.so"), lib)

    def test_no_cap_at_all_raises(self) -> None:
        base = clean_environ()
        for kwargs in [{}, {"pool": "p"}, {"pool": "p", "guarantee": "1Gi"}]:
            with self.assertRaises(gpucap.GpucapError) as caught:
                gpucap.env(base=base, **kwargs)
            self.assertIn("no cap is set", str(caught.exception))
            self.assertIn('limit="none"', str(caught.exception))
        # A cap from anywhere will do; none on purpose too.
        self.assertEqual(gpucap.env(limit="none", base=base)["GPUCAP_LIMIT"], "none")
        self.assertEqual(gpucap.env(pool="p", ceiling="1Gi", base=base)["GPUCAP_CEILING"], "1Gi")
        self.assertEqual(gpucap.env(pool="p", base={**base, "GPUCAP_LIMIT": "2Gi"})["GPUCAP_POOL"], "p")

    def test_an_outer_runs_typed_flags_are_not_this_ones(self) -> None:
        base = clean_environ()
        base.update(GPUCAP_LIMIT="4Gi", GPUCAP_POOL="p", GPUCAP_TYPED="--limit,--pool")
        with self.assertRaises(gpucap.GpucapError) as caught:
            gpucap.env(limit="8Gx", base=base)
        self.assertTrue(str(caught.exception).startswith("limit='8Gx': gpucap: "), str(caught.exception))
        self.assertIn('GPUCAP_LIMIT="8Gx"', str(caught.exception))
        self.assertNotIn("--limit", str(caught.exception))
        e = gpucap.env(limit="1Gi", base=base)
        self.assertEqual(e["GPUCAP_TYPED"], "--pool")
        self.assertNotIn("GPUCAP_TYPED", gpucap.env(limit="1Gi", pool="q", base=base))
        # gpucap run writes each flag with the digest of its value (--limit@<16 hex>).
        digested = {**base, "GPUCAP_TYPED": "--limit@0123456789abcdef,--pool@fedcba9876543210"}
        self.assertEqual(gpucap.env(limit="1Gi", base=digested)["GPUCAP_TYPED"], "--pool@fedcba9876543210")

    def test_checks_warnings_are_passed_on(self) -> None:
        base = clean_environ()
        base["GPUCAP_POOL_DIR"] = "/nonexistent-gpucap-pool-dir"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gpucap.env(limit="1Gi", base=base)
        said = [str(w.message) for w in caught if issubclass(w.category, gpucap.GpucapWarning)]
        line = "gpucap: GPUCAP_POOL_DIR=/nonexistent-gpucap-pool-dir is not a directory"
        self.assertTrue(any(m.startswith(line) for m in said), said)


class Package(unittest.TestCase):
    def test_version_is_the_distributions_and_the_commands(self) -> None:
        from importlib.metadata import version

        self.assertEqual(gpucap.__version__, version("gpucap"))
        out = subprocess.run([gpucap.executable(), "--version"], capture_output=True, text=True, check=True)
        self.assertEqual(out.stdout, f"gpucap {gpucap.__version__}\n")

    def test_no_gpucap_of_another_version_from_path(self) -> None:
        """A copy of the package without an installation record falls back to PATH, and
        takes its gpucap only if it is this version."""
        with InDirectory() as d:
            shutil.copytree(Path(gpucap.__file__).parent, d / "site" / "gpucap")
            (d / "bin").mkdir()
            fake = d / "bin" / "gpucap"
            probe = "import gpucap\ntry:\n print(gpucap.executable())\nexcept gpucap.GpucapError as e:\n print(e)"
            for said in ["gpucap 9.9.9", f"gpucap {gpucap.__version__}"]:
                fake.write_text(f"#!/bin/sh\necho '{said}'\n")
                fake.chmod(0o755)
                environ = {**clean_environ(), "PYTHONPATH": str(d / "site"), "PATH": f"{d / 'bin'}:/usr/bin:/bin"}
                out = subprocess.run(
                    [sys.executable, "-c", probe], env=environ, capture_output=True, text=True, check=True
                ).stdout
                if said == "gpucap 9.9.9":
                    self.assertIn(f"the gpucap on PATH ({fake}) is not this package's", out)
                else:
                    self.assertEqual(out, f"{fake}\n")


class Status(unittest.TestCase):
    def test_without_a_pool_it_is_the_machines_overview(self) -> None:
        with tempfile.TemporaryDirectory() as pools:
            with mock.patch.dict(os.environ, {"GPUCAP_POOL_DIR": pools}):
                for k in [k for k in os.environ if k.startswith("GPUCAP_") and k != "GPUCAP_POOL_DIR"]:
                    del os.environ[k]
                s = gpucap.status()
        self.assertEqual(sorted(s), ["errors", "lone", "pools", "processes", "warnings"])


@unittest.skipUnless(
    os.environ.get("WHEEL_TEST_FAKE_LIBDIR") and os.environ.get("WHEEL_TEST_CLIENT"),
    "WHEEL_TEST_FAKE_LIBDIR and WHEEL_TEST_CLIENT not set (tests/deployment/wheel.rs sets them)",
)
class OnTheFakeGpu(unittest.TestCase):
    def fake_environ(self) -> dict:
        base = clean_environ()
        base["LD_LIBRARY_PATH"] = os.environ["WHEEL_TEST_FAKE_LIBDIR"]
        base["FAKECUDA_TOTAL_MEM"] = "16Gi"
        return base

    def test_a_program_started_with_env_is_capped(self) -> None:
        e = gpucap.env(limit="1Gi", base=self.fake_environ())
        p = subprocess.run(
            [os.environ["WHEEL_TEST_CLIENT"], "256", "256", "600", "256"], env=e, capture_output=True, text=True
        )
        self.assertIn("device 0 total_mem=1073741824\n", p.stdout, p.stderr)
        self.assertIn("alloc 600 err CUDA_ERROR_OUT_OF_MEMORY\n", p.stdout, p.stderr)
        self.assertIn("gpucap: refused", p.stderr)

    def test_inside_a_capped_process_check_still_sees_the_gpus(self) -> None:
        # As in a kernel under `gpucap run --limit 4Gi`: the shim preloaded, its flag typed.
        base = self.fake_environ()
        base.update(LD_PRELOAD=str(gpucap.library_path()), GPUCAP_LIMIT="4Gi", GPUCAP_TYPED="--limit")
        with self.assertRaises(gpucap.GpucapError) as caught:
            gpucap.env(limit="0=1Gi,3=1Gi", base=base)
        self.assertIn("names GPU 3, but only 1 GPU is visible", str(caught.exception))
        self.assertTrue(str(caught.exception).startswith("limit='0=1Gi,3=1Gi': gpucap: "), str(caught.exception))
        e = gpucap.env(limit="0=1Gi", base=base)
        self.assertEqual(e["LD_PRELOAD"], str(gpucap.library_path()))

    def test_status_of_a_pool(self) -> None:
        with tempfile.TemporaryDirectory() as pool_dir:
            pool = os.path.join(pool_dir, "team.pool")
            # No process has joined it yet: gpucap's message.
            with self.assertRaises(gpucap.GpucapError) as caught:
                gpucap.status(pool=pool)
            self.assertIn("no pool file", str(caught.exception))
            e = gpucap.env(limit="1Gi", pool=pool, base=self.fake_environ())
            p = subprocess.run([os.environ["WHEEL_TEST_CLIENT"], "256"], env=e, capture_output=True, text=True)
            self.assertIn("alloc 256 ok", p.stdout, p.stderr)
            s = gpucap.status(pool=pool)
            self.assertEqual(s["path"], pool)
            self.assertEqual(len(s["gpus"]), 1)
            self.assertEqual(s["gpus"][0]["cap"], 1 << 30)
            self.assertEqual(s["gpus"][0]["peak"], 256 << 20)
            self.assertEqual(s["members"], [])


class Main(unittest.TestCase):
    def run_module(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "gpucap", *args], env=clean_environ(), capture_output=True, text=True
        )

    def test_python_m_gpucap_is_the_command(self) -> None:
        direct = subprocess.run([gpucap.executable(), "--version"], capture_output=True, text=True)
        via = self.run_module("--version")
        self.assertEqual((via.returncode, via.stdout), (0, direct.stdout))
        self.assertTrue(via.stdout.startswith("gpucap "), via.stdout)

    def test_exit_status_and_message_are_the_commands(self) -> None:
        via = self.run_module("check", "--limit", "8Gx")
        self.assertEqual(via.returncode, 2)
        self.assertIn('unknown unit "Gx"', via.stderr)
        via = self.run_module("run", "--limit", "1Gi", "--", "sh", "-c", "exit 7")
        self.assertEqual(via.returncode, 7, via.stderr)


if __name__ == "__main__":
    unittest.main()
