"""scripts/setup.sh: what it says before an install that cannot fit on the disk.

The install itself is exercised by every CI run (the suite runs in the environments it makes); what a CI run cannot
show is the message when the disk is too full, which once surfaced only as pip's "No space left on device" half-way
through MindSpore 2.7.0. SETUP_NEED_MB stands in for a full disk.
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_a_disk_too_full_for_mindspore_is_named_before_pip_runs(tmp_path):
    venv = tmp_path / "venv"
    env = dict(os.environ, SETUP_NEED_MB=str(10 ** 9), VENV=str(venv), MINDSPORE="2.9.0", PYTHON=sys.executable)
    result = subprocess.run(["bash", os.path.join(ROOT, "scripts", "setup.sh")], env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 1, result.stderr
    assert result.stdout == ""
    assert f"installing MindSpore 2.9.0 needs about {10 ** 9} MB free where {venv} lies" in result.stderr
    assert "set VENV= or TMPDIR= to a larger disk" in result.stderr
    # Nothing was installed: the new environment holds no MindSpore and no ms_accum.
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import mindspore"], capture_output=True, check=False)
    assert check.returncode != 0
