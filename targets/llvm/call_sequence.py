"""A kernel library's sequence runner: many kernel calls in one call from the host.

``int32_t tilecraft_call_sequence(intptr_t *records, int32_t n, int32_t *failed)``
    For ``i`` in ``[0, n)``: ``records[4i .. 4i+3]`` are a kernel entry, its packed arguments,
    its type codes and its argument count; call ``entry(args, codes, count)``. On the first
    nonzero result, store ``i`` in ``*failed`` and return that result (the kernel's message is
    in ``tilecraft_get_last_error``, as for a direct call); return 0 when all succeed.

The Relax VM calls a run of kernels whose argument arrays are already written (a shape plan's
steady state) through this one function: one foreign call instead of one per kernel, the
ctypes cost (a few hundred ns a call) paid once per run. It lives in every library's glue
object; a library without it (built before it existed) is called kernel by kernel.
"""
from __future__ import annotations

from . import llvmir as ir

from tilecraft.targets.runtime import abi

from .irutil import I32, PTR, ModuleBuilder

RECORD_WORDS = 4    # entry, args, type codes, argument count


def emit_call_sequence(mb: ModuleBuilder) -> ir.Function:
    """Define ``abi.CALL_SEQUENCE_SYMBOL`` in ``mb``'s module."""
    ip = mb.intptr
    fn = ir.Function(mb.module, ir.FunctionType(I32, [PTR, I32, PTR]), abi.CALL_SEQUENCE_SYMBOL)
    fn.attributes.add("nounwind")
    records, count, failed = fn.args
    records.name, count.name, failed.name = "records", "n", "failed"
    entry_bb, head_bb, body_bb, fail_bb, done_bb = (
        fn.append_basic_block(n) for n in ("entry", "head", "body", "fail", "done"))
    b = ir.IRBuilder(entry_bb)
    b.branch(head_bb)
    b.position_at_end(head_bb)
    i = b.phi(I32, name="i")
    i.add_incoming(I32(0), entry_bb)
    b.cbranch(b.icmp_signed("<", i, count), body_bb, done_bb)
    b.position_at_end(body_bb)
    base = b.mul(b.sext(i, ip) if ip.width > 32 else i, ir.Constant(ip, RECORD_WORDS))

    def word(k):
        return b.load(b.gep(records, [b.add(base, ir.Constant(ip, k))], source_etype=ip), typ=ip)

    # a typed pointer, so that llvmlite knows the signature of the indirect call
    target = b.inttoptr(word(0), ir.FunctionType(I32, [PTR, PTR, I32]).as_pointer())
    args = b.inttoptr(word(1), PTR)
    codes = b.inttoptr(word(2), PTR)
    nargs = b.trunc(word(3), I32) if ip.width > 32 else word(3)
    rc = b.call(target, [args, codes, nargs])
    i.add_incoming(b.add(i, I32(1)), body_bb)
    b.cbranch(b.icmp_signed("==", rc, I32(0)), head_bb, fail_bb)
    b.position_at_end(fail_bb)
    b.store(i, failed)
    b.ret(rc)
    b.position_at_end(done_bb)
    b.ret(I32(0))
    return fn
