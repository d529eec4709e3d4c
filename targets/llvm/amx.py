"""Intel AMX int8 tiles in LLVM IR: the block kernel behind the TIR intrinsic ``AMX_U8I8``.

``Evaluate(Call("int32", AMX_U8I8, [c[..], a[..], b[..], c'[..], a'[..], b'[..], rows, ksteps,
col_tiles]))`` (the impl of the tensor intrinsic ``amx_u8s8s32_{M}x{N}x{K}``,
``tensorir.schedule.intrinsics``) adds to the int32 block ``C`` (``rows`` x ``16 * col_tiles``,
starting at the element ``c[..]`` names) the product of the uint8 activations ``A`` (``rows``
rows of ``64 * ksteps`` bytes, from ``a[..]``) and the int8 weight panel ``B`` in the VNNI
layout (``16 * ksteps`` rows of words, word ``[kw, n]`` holding ``W[4 kw + p, n]`` in byte
``p``, from ``b[..]``): the ``dense_u8i8`` kernel's operands (``relax.backend.cpu.dense_amx``).
``c'``, ``a'``, ``b'`` name each operand's next row: the row strides ``ldc``, ``lda``, ``ldb``
are the distances to them in the flattened buffers. ``rows`` is 1..32, ``ksteps`` and
``col_tiles`` are constants.

The code generator calls one internal function per ``col_tiles`` (``tilecraft.amx.u8i8.<n>``,
``emit_block``). It writes the 64-byte palette-1 tile configuration on its stack (C tiles 0-3,
16 x 64 bytes; A tiles 4-5, ``min(rows, 16)`` and ``rows - 16`` rows of 64 bytes; B tiles
6-7, 16 rows of 64 bytes) and loads it (``ldtilecfg``); then, for each pair of 16-column tiles
of C, it loads the 2 x 2 (or 1 x 2 for at most 16 rows) C tiles, runs the whole reduction on
them (per 64 bytes of K: two A tiles, two B tiles and four ``tdpbusd``, each 16 x 16 x 64
multiply-adds, exact in int32), stores them back once, and releases the tiles
(``tilerelease``). LLVM's immediate-tile intrinsics are used (``llvm.x86.tileloadd64``,
``llvm.x86.tdpbusd``, ...): tile numbers are constants here, so no tile register allocation is
needed.

Linux gives a process the AMX register state only on request
(``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``); a module whose functions carry
``uses_amx`` in their metadata makes that request when it is loaded
(``targets.runtime.amx.request_amx``), before any tile instruction runs.

Examples
--------
>>> has_amx_int8("x86_64", "+avx512f,+amx-tile,+amx-int8")
True
>>> has_amx_int8("x86_64", "+avx512f,+amx-tile,+amx-int8,-amx-int8")
False
"""
from __future__ import annotations

from tilecraft.tensorir.expr import AMX_U8I8

from . import llvmir as ir
from .irutil import ModuleBuilder

__all__ = ["AMX_U8I8", "has_amx_int8", "emit_block", "block_function"]

I8 = ir.IntType(8)
I16 = ir.IntType(16)
I64 = ir.IntType(64)
PTR = ir.PointerType()
VOID = ir.VoidType()

# tile register numbers: C 2 x 2 (row block r, column tile c: 2 r + c), A per row block, B per
# column tile
_C = ((0, 1), (2, 3))
_A = (4, 5)
_B = (6, 7)


def has_amx_int8(arch: str, features: str) -> bool:
    """Whether LLVM feature string ``features`` (the last mention of a feature wins, as in
    LLVM) enables ``amx-int8`` (and with it ``amx-tile``) on x86-64.

    Examples
    --------
    >>> has_amx_int8("aarch64", "+amx-int8")
    False
    """
    if arch != "x86_64":
        return False
    state = {}
    for f in features.split(","):
        f = f.strip()
        if f[:1] in "+-" and len(f) > 1:
            state[f[1:]] = f[0] == "+"
    # +amx-int8 implies amx-tile in LLVM unless amx-tile is turned off
    return bool(state.get("amx-int8") and state.get("amx-tile", True))


def _intrinsics(mb: ModuleBuilder) -> dict:
    return {
        "ldtilecfg": mb.declare("llvm.x86.ldtilecfg", VOID, [PTR]),
        "tilerelease": mb.declare("llvm.x86.tilerelease", VOID, []),
        "load": mb.declare("llvm.x86.tileloadd64", VOID, [I8, PTR, I64]),
        "store": mb.declare("llvm.x86.tilestored64", VOID, [I8, PTR, I64]),
        "dp": mb.declare("llvm.x86.tdpbusd", VOID, [I8, I8, I8]),
    }


def _write_config(b: ir.IRBuilder, cfg, rows0, rows1, width: int) -> None:
    """The palette-1 configuration at ``cfg`` (64 bytes, zeroed first) for ``rows0`` /
    ``rows1`` rows in the two row blocks (i8 values, ``rows1`` 0 for at most 16 rows) and
    ``width`` (1 or 2) column tiles: bytes 16 + 2 t hold tile ``t``'s bytes per row, byte
    48 + t its rows; an unused tile has 0 of both."""
    for off in range(0, 64, 8):
        b.store(I64(0), b.gep(cfg, [I64(off)], source_etype=I8), align=8)
    b.store(I8(1), cfg, align=1)                                   # palette 1
    colsb1 = b.select(b.icmp_unsigned("!=", rows1, I8(0)), I16(64), I16(0))

    def tile(t, rows, colsb):
        b.store(colsb, b.gep(cfg, [I64(16 + 2 * t)], source_etype=I8), align=2)
        b.store(rows, b.gep(cfg, [I64(48 + t)], source_etype=I8), align=1)

    for c in range(width):
        tile(_C[0][c], rows0, I16(64))
        tile(_C[1][c], rows1, colsb1)
        tile(_B[c], I8(16), I16(64))
    tile(_A[0], rows0, I16(64))
    tile(_A[1], rows1, colsb1)


def _pair(fn, b: ir.IRBuilder, x: dict, blocks: tuple, width: int, tag: str, col_off,
          args: tuple) -> None:
    """One pair of column tiles over row blocks ``blocks``: load the C tiles, the whole
    reduction (per step of 16 words: A tiles, B tiles, ``tdpbusd`` each C tile), store them."""
    c_ptr, a_ptr, b_ptr, lda, ldb, ldc, ksteps = args

    def c_addr(rb, c):
        off = b.add(b.mul(I64(16 * rb), ldc), b.add(col_off, I64(64 * c)))
        return b.gep(c_ptr, [off], source_etype=I8)

    for rb in blocks:
        for c in range(width):
            b.call(x["load"], [I8(_C[rb][c]), c_addr(rb, c), ldc])
    head = b.block
    loop_bb = fn.append_basic_block(f"{tag}.k")
    end_bb = fn.append_basic_block(f"{tag}.kend")
    b.branch(loop_bb)
    b.position_at_end(loop_bb)
    t = b.phi(I64, name="t")
    t.add_incoming(I64(0), head)
    for rb in blocks:
        off = b.add(b.mul(I64(16 * rb), lda), b.mul(t, I64(64)))
        b.call(x["load"], [I8(_A[rb]), b.gep(a_ptr, [off], source_etype=I8), lda])
    for c in range(width):
        off = b.add(b.mul(b.mul(t, I64(16)), ldb), b.add(col_off, I64(64 * c)))
        b.call(x["load"], [I8(_B[c]), b.gep(b_ptr, [off], source_etype=I8), ldb])
    for rb in blocks:
        for c in range(width):
            b.call(x["dp"], [I8(_C[rb][c]), I8(_A[rb]), I8(_B[c])])
    t_next = b.add(t, I64(1))
    t.add_incoming(t_next, loop_bb)
    b.cbranch(b.icmp_unsigned("<", t_next, ksteps), loop_bb, end_bb)
    b.position_at_end(end_bb)
    for rb in blocks:
        for c in range(width):
            b.call(x["store"], [I8(_C[rb][c]), c_addr(rb, c), ldc])


def block_function(mb: ModuleBuilder, col_tiles: int) -> ir.Function:
    """The internal function ``tilecraft.amx.u8i8.<col_tiles>`` (defined once per module):
    ``(c, a, b, rows, lda, ldb, ldc, ksteps)`` with pointers and i64 counts (strides in
    bytes), doing what the module docstring says."""
    name = f"tilecraft.amx.u8i8.{col_tiles}"
    existing = mb.module.globals.get(name)
    if existing is not None:
        return existing
    fn = ir.Function(mb.module, ir.FunctionType(VOID, [PTR, PTR, PTR, I64, I64, I64, I64, I64]),
                     name)
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    c_ptr, a_ptr, b_ptr, rows, lda, ldb, ldc, ksteps = fn.args
    for arg, nm in zip(fn.args, ("c", "a", "b", "rows", "lda", "ldb", "ldc", "ksteps")):
        arg.name = nm
    x = _intrinsics(mb)
    entry = fn.append_basic_block("entry")
    b = ir.IRBuilder(entry)
    cfg = b.alloca(ir.ArrayType(I8, 64), name="tilecfg")
    cfg.align = 64
    two = b.icmp_unsigned(">", rows, I64(16))
    rows0 = b.trunc(b.select(two, I64(16), rows), I8)
    rows1 = b.trunc(b.select(two, b.sub(rows, I64(16)), I64(0)), I8)
    pairs = [(p, min(2, col_tiles - p)) for p in range(0, col_tiles, 2)]
    current = None
    for p, width in pairs:
        if width != current:
            # an odd last column tile: the pair's second B and C column tiles unused
            _write_config(b, cfg, rows0, rows1, width)
            b.call(x["ldtilecfg"], [cfg])
            current = width
        col_off = I64(64 * p)                  # 16 int32 words per column tile
        one_bb = fn.append_basic_block(f"pair{p}.rows16")
        two_bb = fn.append_basic_block(f"pair{p}.rows32")
        done_bb = fn.append_basic_block(f"pair{p}.done")
        b.cbranch(two, two_bb, one_bb)
        for blocks, bb in (((0,), one_bb), ((0, 1), two_bb)):
            b.position_at_end(bb)
            _pair(fn, b, x, blocks, width, f"pair{p}.r{len(blocks)}", col_off,
                  (c_ptr, a_ptr, b_ptr, lda, ldb, ldc, ksteps))
            b.branch(done_bb)
        b.position_at_end(done_bb)
    b.call(x["tilerelease"], [])
    b.ret_void()
    return fn


def emit_block(mb: ModuleBuilder, b: ir.IRBuilder, c, a, w, rows, lda, ldb, ldc,
               ksteps: int, col_tiles: int) -> None:
    """Call ``block_function(mb, col_tiles)`` on element pointers ``c`` (int32), ``a``, ``w``
    and the row count ``rows`` (an integer value); strides in int32 elements (ints, or i64
    values)."""
    fn = block_function(mb, col_tiles)
    rows = b.sext(rows, I64) if rows.type.width < 64 else rows

    def nbytes(ld):
        return I64(4 * ld) if isinstance(ld, int) else b.mul(ld, I64(4))
    b.call(fn, [c, a, w, rows, nbytes(lda), nbytes(ldb), nbytes(ldc), I64(ksteps)])
