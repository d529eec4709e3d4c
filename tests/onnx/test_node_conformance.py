"""ONNX's backend node tests (generated in memory by ``collect_testcases``) through
``relax.frontend.from_onnx``, ``relax.build`` and the VM; see benchmarks/onnx_conformance.py.

Every case must pass except those in tests/onnx/unsupported_cases.txt, each with its reason;
a listed case that passes fails the suite too, so the list only shrinks
(``python -m benchmarks.onnx_conformance --update-allowlist`` rewrites it).
"""
import pytest

from benchmarks import onnx_conformance as conformance

CASES = [c.name for c in conformance.collect_cases()]
ALLOWED = conformance.read_allowlist()


@pytest.fixture(scope="module")
def results():
    """All cases, imported into shared modules and built in two worker processes."""
    return conformance.run_tilecraft()


def test_allowlist_names_real_cases_with_reasons():
    unknown = sorted(set(ALLOWED) - set(CASES))
    assert not unknown, f"unsupported_cases.txt lists cases that do not exist: {unknown[:10]}"
    assert all(ALLOWED.values()), "every allow-listed case needs a reason (a ## header)"


def test_pass_rate(results):
    passed = sum(1 for r in results.values() if r["status"] == "pass")
    # the allow-list holds what fails; everything else must pass (checked per case below)
    assert passed >= len(CASES) - len(ALLOWED)


@pytest.mark.parametrize("name", CASES)
def test_node_case(results, name):
    r = results[name]
    if name in ALLOWED:
        if r["status"] == "pass":
            pytest.fail(f"{name} passes now: remove it from tests/onnx/unsupported_cases.txt")
        pytest.xfail(ALLOWED[name])
    assert r["status"] == "pass", f"{r['status']}: {r.get('error', '')}"
