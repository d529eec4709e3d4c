"""The project's layering check on this tree: tensorir < targets < rpc < metaschedule < relax,
and ``tilecraft.rpc.server`` importing without the compiler's libraries.

The check, ``check_layers.py``, is the project's shared tool and lives outside the repository
(``shared/tools/`` beside the checkouts); it is run where it is, never copied. It is found at
``$TILECRAFT_CHECK_LAYERS``, else in ``shared/tools/`` of a folder above the checkout. A machine
without it skips this test naming it, and CI (``CI=true``) fails: CI must provide the tool.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from capabilities import REPO, requires


def check_layers_tool() -> str | None:
    given = os.environ.get("TILECRAFT_CHECK_LAYERS")
    if given:
        assert os.path.isfile(given), f"TILECRAFT_CHECK_LAYERS={given} is not a file"
        return given
    for folder in Path(REPO).resolve().parents:
        candidate = folder / "shared" / "tools" / "check_layers.py"
        if candidate.is_file():
            return str(candidate)
    return None


def test_the_layering_check_passes_on_this_tree():
    tool = check_layers_tool()
    requires("the project's layering check, shared/tools/check_layers.py", tool,
             "set TILECRAFT_CHECK_LAYERS to its path; it is not part of the repository")
    proc = subprocess.run([sys.executable, tool, REPO], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.startswith("layers ok"), proc.stdout
