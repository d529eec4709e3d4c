"""The rule of tests/capabilities.py: a missing driver or tool skips a test on a developer's machine
and fails it under CI=true, naming what is missing and how to install it — as a call, as a mark
and at module level. Checked on a small test file run by its own pytest."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from capabilities import REPO

SAMPLE = '''
import pytest
from capabilities import needs, requires, import_or_require

def test_call():
    requires("the frobnicator", False, "apt-get install frobnicator")

@needs("the widget driver", False, "apt-get install widget")
def test_mark():
    pass

@needs("ld.so", True, "always there")
def test_present():
    requires("python", True, "always there")

def test_genuine_skip():
    pytest.skip("the host has no AVX-512")
'''

MODULE_LEVEL = '''
from capabilities import import_or_require
nope = import_or_require("no_such_module_xyz", "pip install no-such-module-xyz")

def test_never():
    pass
'''


def run_pytest(tmp_path, ci: bool) -> str:
    """Run SAMPLE and MODULE_LEVEL with the suite's conftest (it applies the mark)."""
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    (tmp_path / "test_module_level.py").write_text(MODULE_LEVEL)
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    if ci:
        env["CI"] = "true"
    env["PYTHONPATH"] = os.path.join(REPO, "tests") + os.pathsep + REPO
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
                           "-p", "conftest", "--continue-on-collection-errors",
                           "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    return proc.stdout


@pytest.mark.parametrize("ci", [False, True])
def test_missing_capabilities_skip_or_fail_naming_what_is_missing(tmp_path, ci):
    out = run_pytest(tmp_path, ci)
    call = "needs the frobnicator (apt-get install frobnicator)"
    mark = "needs the widget driver (apt-get install widget)"
    module = "needs the Python package no_such_module_xyz (pip install no-such-module-xyz)"
    if ci:
        # a failed mark fails the test's setup, a failed module its collection: errors
        assert "1 failed, 1 passed, 1 skipped, 2 errors" in out, out
        for what in (call, mark, module):
            assert f"CI=true and this test cannot run: it {what}" in out, out
    else:
        assert "1 passed, 4 skipped" in out, out
        assert call in out and mark in out and module in out, out
    assert "the host has no AVX-512" in out     # a genuine skip stays one
