"""The variants prepared for a GPU session (benchmarks/patches/*.diff, applied to the device copy
by benchmarks/tools/gpu_pending.sh for one step) still apply to this tree: a patch that stopped
applying would fail its step on the GPU, after the device time was spent."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from attngen.env import REPO_ROOT

PATCHES = sorted((REPO_ROOT / "benchmarks" / "patches").glob("*.diff"))


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.name)
def test_prepared_patch_applies(patch):
    got = subprocess.run(["git", "apply", "--check", str(patch)], cwd=REPO_ROOT, capture_output=True, text=True)
    assert got.returncode == 0, got.stderr


def test_the_pending_steps_name_only_patches_that_exist():
    script = (REPO_ROOT / "benchmarks" / "tools" / "gpu_pending.sh").read_text()
    code = "\n".join(line for line in script.splitlines() if not line.lstrip().startswith("#"))
    named = set(re.findall(r"benchmarks/patches/([\w.-]+\.diff)", code))
    assert named <= {p.name for p in PATCHES}, named
