"""Intrinsics that name buffer elements (``tensorir.expr.WRITES_FIRST_ARG``,
``INTRINSIC_ELEMENTS``: the tensor-core copy and mma): the device lowering puts a barrier
between a shared tile written through one and its reads by other threads, and the allocation
compaction keeps every element an intrinsic names (not only the first)."""
from tilecraft.tensorir import expr as E
from tilecraft.tensorir.expr import Var, call, floordiv, floormod
from tilecraft.tensorir.function import PrimFunc
from tilecraft.tensorir.functor import post_order_visit
from tilecraft.tensorir.stmt import Allocate, Buffer, BufferStore, Evaluate, For, seq
from tilecraft.tensorir.transform import lower_device
from tilecraft.tensorir.transform.device import is_barrier


def _func():
    """Each of 32 threads copies 16 bytes of A into a shared tile through the intrinsic (its
    staging registers written through it too), then reads a word another thread wrote."""
    A = Buffer("A", (128,), "uint32")
    O = Buffer("O", (32,), "uint32")
    tile = Buffer("tile", (128,), "uint32", scope="shared")
    stage = Buffer("stage", (4,), "uint32", scope="local")
    tx = Var("tx")
    body = seq(
        Evaluate(call(E.TC_LOAD_B128, stage[0], A[tx * 4], dtype="int32")),
        Evaluate(call(E.TC_LOAD_B128, tile[tx * 4], stage[0], dtype="int32")),
        BufferStore(O, tile[floormod(tx + 1, 32) * 4 + floordiv(tx, 8)], [tx]))
    body = For(tx, 0, 32, "thread_binding", Allocate(stage, body), thread_tag="threadIdx.x")
    body = Allocate(tile, body)
    handles = [Var("A", "handle"), Var("O", "handle")]
    return PrimFunc(handles, body, dict(zip(handles, (A, O))),
                    attrs={"global_symbol": "f", "tir.is_scheduled": True})


def test_barrier_after_a_shared_write_through_an_intrinsic():
    kernel = lower_device(_func(), {"max_threads_per_block": 256}).kernels[0]
    order = []

    def visit(n):
        if is_barrier(n):
            order.append("barrier")
        elif isinstance(n, BufferStore) and n.buffer.name == "O":
            order.append("read")
        elif isinstance(n, Evaluate) and isinstance(n.value, E.Call) and \
                n.value.op == E.TC_LOAD_B128 and n.value.args[0].buffer.scope == "shared":
            order.append("write")
    post_order_visit(kernel.func.body, visit)
    assert order == ["write", "barrier", "read"]


def test_compaction_keeps_the_elements_an_intrinsic_names():
    kernel = lower_device(_func(), {"max_threads_per_block": 256}).kernels[0]
    sizes = {}

    def visit(n):
        if isinstance(n, Allocate):
            sizes[n.buffer.name] = n.buffer.shape[0].value
    post_order_visit(kernel.func.body, visit)
    assert sizes["stage"] == 4 and sizes["tile"] == 128
