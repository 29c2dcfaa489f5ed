"""The operations scripts parse, pass shellcheck, and fail with a clear message when misused."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from ops_helpers import REPO

SCRIPTS = [
    REPO / "scripts" / "k8s-chaos.sh",
    REPO / "scripts" / "check-chart",
    REPO / "deploy" / "docker" / "fetch-jars.sh",
    REPO / "deploy" / "docker" / "spark-executor.sh",
]
CHAOS = REPO / "scripts" / "k8s-chaos.sh"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_is_executable_and_clean(script: Path) -> None:
    assert script.stat().st_mode & 0o111, f"{script} is not executable"
    shell = "sh" if script.read_text().startswith("#!/bin/sh") else "bash"
    res = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.fail("shellcheck is not installed (Debian package `shellcheck`)", pytrace=False)
    res = subprocess.run([shellcheck, str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout


def test_chaos_script_usage_and_preconditions() -> None:
    res = subprocess.run(["bash", str(CHAOS), "--help"], capture_output=True, text=True)
    assert res.returncode == 2 and "--query-image" in res.stderr and "--iterations" in res.stderr
    res = subprocess.run(["bash", str(CHAOS)], capture_output=True, text=True)
    assert res.returncode == 2, "the release is required"
    res = subprocess.run(["bash", str(CHAOS), "-r", "x", "--mode", "nap"], capture_output=True, text=True)
    assert res.returncode == 1 and "--mode must be" in res.stderr
    # no cluster: a clear message, whether kubectl is missing or has nowhere to go
    env = {"PATH": "/usr/bin:/bin", "KUBECONFIG": "/nonexistent", "HOME": "/nonexistent"}
    res = subprocess.run(
        ["bash", str(CHAOS), "-r", "x"], capture_output=True, text=True, env=env, timeout=120
    )
    assert res.returncode == 1
    assert "kubectl is not installed" in res.stderr or "cannot list Deployments" in res.stderr, res.stderr
