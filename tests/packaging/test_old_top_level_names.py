"""The pre-0.2 top-level names do not import in the test suite (tests/conftest.py refuses them), so
a stale `import relax` cannot load a second copy of a package beside tilecraft.relax."""
import pytest
def test_old_names_refused():
    with pytest.raises(ImportError, match="from tilecraft import relax"):
        import relax  # noqa: F401
