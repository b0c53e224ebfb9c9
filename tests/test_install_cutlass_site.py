"""scripts/install_cutlass_site.sh: the CUTLASS headers on a machine without network, from the
small pack carried into .whl/ (here a stand-in pack with the same layout)."""

import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "install_cutlass_site.sh"


@pytest.fixture()
def checkout(tmp_path):
    """A copy of the script in a checkout-shaped folder whose .whl/ holds a stand-in pack."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts")
    src = tmp_path / "src"
    version = src / "cutlass_library" / "source" / "include" / "cutlass" / "version.h"
    version.parent.mkdir(parents=True)
    version.write_text("#define CUTLASS_MAJOR 4\n")
    (src / "cutlass_library" / "__init__.py").write_text("")
    (tmp_path / ".whl").mkdir()
    with tarfile.open(tmp_path / ".whl" / "cutlass_site.tar.xz", "w:xz") as tar:
        tar.add(src / "cutlass_library", arcname="cutlass_library")
    return tmp_path


def run(checkout: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(checkout / "scripts" / SCRIPT.name)], capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", "CUTLASS_SITE": str(site)})


def test_installs_from_the_pack(checkout, tmp_path):
    site = tmp_path / "site"
    done = run(checkout, site)
    assert done.returncode == 0, done.stderr
    version = site / "cutlass_library" / "source" / "include" / "cutlass" / "version.h"
    assert version.read_text() == "#define CUTLASS_MAJOR 4\n"
    assert (site / "cutlass_library" / "__init__.py").is_file()


def test_leaves_an_installed_site_alone(checkout, tmp_path):
    site = tmp_path / "site"
    assert run(checkout, site).returncode == 0
    marker = site / "cutlass_library" / "kept"
    marker.write_text("x")
    (checkout / ".whl" / "cutlass_site.tar.xz").unlink()  # nothing to install from: not needed
    assert run(checkout, site).returncode == 0 and marker.is_file()


def test_fails_without_headers_or_wheel(checkout, tmp_path):
    (checkout / ".whl" / "cutlass_site.tar.xz").unlink()
    done = run(checkout, tmp_path / "site")
    assert done.returncode != 0


def test_installs_into_a_site_whose_folder_does_not_exist_yet(checkout, tmp_path):
    site = tmp_path / "deeper" / "still" / "site"
    done = run(checkout, site)
    assert done.returncode == 0, done.stderr
    assert (site / "cutlass_library" / "__init__.py").is_file()
    # nothing half-installed is left beside it
    assert [p.name for p in site.parent.iterdir()] == ["site"]


def test_a_failed_install_leaves_no_partial_tree(checkout, tmp_path):
    (checkout / ".whl" / "cutlass_site.tar.xz").write_bytes(b"not an archive")
    site = tmp_path / "site"
    assert run(checkout, site).returncode != 0
    assert not (site / "cutlass_library").exists()
    assert not list(tmp_path.glob("site.partial.*"))
