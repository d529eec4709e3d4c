"""benchmarks.shared_kernels: the call sequence that pairs each shared kernel with the kernels
it replaces (the whole benchmark builds zoo models twice: run it by hand)."""
from benchmarks.shared_kernels import _call_sequence


def test_call_sequence_is_the_programs_kernel_calls_in_order():
    program = {"version": 1, "kernels": ["a", "b"], "functions": {
        "main": {"code": [["alloc", 3, [1], "float32"], ["call_kernel", "a", [0, 3], [], 1],
                          ["call_kernel", "b", [3, 4], [], 1], ["call_kernel", "a", [4, 5], [], 1],
                          ["return", 5]]}}}
    assert _call_sequence(program) == ["a", "b", "a"]
