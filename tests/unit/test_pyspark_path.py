"""service/pyspark_path.py: a Python started with Spark's PYTHONPATH imports the installed pyspark, not
the zipped copy of it that Spark puts first."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pyspark

from service.pyspark_path import PTH_LINE, PTH_NAME, bundled_zip, drop_bundled_zips, install

INSTALLED = Path(pyspark.__file__).parent
ZIPS = sorted(str(z) for z in (INSTALLED / "python" / "lib").glob("*.zip"))


def _site(tmp_path: Path, name: str) -> Path:
    """A directory holding an installed pyspark package and its bundled zips."""
    site = tmp_path / name
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    for zipped in ("pyspark.zip", "py4j-0.10.9.9-src.zip"):
        (lib / zipped).write_bytes(b"")
    return site


def test_the_zips_of_a_pyspark_installed_on_the_path_are_dropped(tmp_path: Path) -> None:
    site = _site(tmp_path, "site-packages")
    zips = [
        str(site / "pyspark/python/lib/pyspark.zip"),
        str(site / "pyspark/python/lib/py4j-0.10.9.9-src.zip"),
    ]
    path = [*zips, "/usr/lib/python311.zip", "/usr/lib/python3.11", str(site)]
    drop_bundled_zips(path)
    assert path == ["/usr/lib/python311.zip", "/usr/lib/python3.11", str(site)]


def test_the_zips_are_dropped_when_the_path_reaches_the_same_pyspark_through_a_symlink(
    tmp_path: Path,
) -> None:
    """Spark's $SPARK_HOME is pyspark's resolved directory; the venv's path may go through a symlink."""
    site = _site(tmp_path, "site-packages")
    (tmp_path / "venv").symlink_to(site)
    zipped = str(site / "pyspark/python/lib/pyspark.zip")
    path = [zipped, str(tmp_path / "venv")]
    drop_bundled_zips(path)
    assert path == [str(tmp_path / "venv")]


def test_the_zips_of_a_spark_distribution_elsewhere_stay(tmp_path: Path) -> None:
    """A $SPARK_HOME of its own (its pyspark may differ from the installed one), and an installed pyspark
    whose directory is not on the path, keep their zips: they are what the process would import."""
    distribution = tmp_path / "spark-4.1.3" / "python" / "lib" / "pyspark.zip"
    distribution.parent.mkdir(parents=True)
    distribution.write_bytes(b"")
    off_path = _site(tmp_path, "other-venv")
    on_path = _site(tmp_path, "site-packages")
    kept = [str(distribution), str(off_path / "pyspark/python/lib/pyspark.zip")]
    assert not any(bundled_zip(entry, [*kept, str(on_path)]) for entry in kept)
    # A directory named like site-packages but without pyspark installed in it.
    (on_path / "pyspark" / "__init__.py").unlink()
    entry = str(on_path / "pyspark/python/lib/pyspark.zip")
    assert not bundled_zip(entry, [entry, str(on_path)])


def test_install_writes_the_line_once(tmp_path: Path) -> None:
    target = Path(install(str(tmp_path)))
    assert target == tmp_path / PTH_NAME and target.read_text() == PTH_LINE
    os.utime(target, ns=(0, 0))
    install(str(tmp_path))
    assert target.stat().st_mtime_ns == 0  # not written again


def test_a_python_given_sparks_path_imports_the_installed_pyspark() -> None:
    """This environment has the .pth (scripts/bootstrap writes it): an interpreter started with the
    PYTHONPATH Spark gives its Python processes imports pyspark and py4j from site-packages."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    assert (purelib / PTH_NAME).read_text() == PTH_LINE, f"no {PTH_NAME} in {purelib}: run scripts/bootstrap"
    assert len(ZIPS) == 2, ZIPS
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(ZIPS)}
    # What the interpreter still has of the zips: path entries, or zip importers (which each
    # importlib.invalidate_caches() before a Spark task would read again).
    probe = (
        "import sys, pyspark, py4j; print(pyspark.__file__, py4j.__file__, "
        "*[p for p in [*sys.path, *sys.path_importer_cache] if 'pyspark/python/lib' in p])"
    )
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.split() == [str(INSTALLED / "__init__.py"), str(purelib / "py4j" / "__init__.py")], (
        done
    )
    assert done.stderr == "", done.stderr
