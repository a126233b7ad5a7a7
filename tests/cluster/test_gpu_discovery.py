"""conf/spark/getGpusResources.sh: the JSON that Spark's resource discovery expects, from nvidia-smi."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "conf" / "spark" / "getGpusResources.sh"


def discover(tmp_path, nvidia_smi: str | None) -> dict:
    """Run the script with PATH holding only a fake nvidia-smi (or nothing)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if nvidia_smi is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text("#!/bin/sh\n" + nvidia_smi + "\n")
        fake.chmod(0o755)
    proc = subprocess.run(
        [shutil.which("bash"), str(SCRIPT)],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize(
    "nvidia_smi, addresses",
    [
        ("printf '0\\n1\\n'", ["0", "1"]),
        ("echo 3", ["3"]),
        (None, []),  # no driver installed
        ("exit 9", []),  # nvidia-smi present but failing (driver not loaded)
    ],
)
def test_discovery_script_prints_the_gpu_addresses(tmp_path, nvidia_smi, addresses):
    assert discover(tmp_path, nvidia_smi) == {"name": "gpu", "addresses": addresses}


def test_discovery_script_is_executable():
    assert SCRIPT.stat().st_mode & 0o111
