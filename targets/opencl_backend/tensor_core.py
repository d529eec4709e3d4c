"""Tensor cores from OpenCL C on NVIDIA: the text of the tensor-core intrinsics
(``tensorir.expr.TC_MMA``, ``TC_LOAD_B128``, ``TC_PACK_LO`` / ``TC_PACK_HI``) as the OpenCL
code generator prints them. The PTX lives here and nowhere else.

NVIDIA's OpenCL compiler accepts inline PTX (``asm volatile``), and an sm_80-or-newer GPU runs
``mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32``: a warp multiplies a 16 x 16 float16
tile of A by a 16 x 8 float16 tile of B into 16 x 8 float32 accumulators, each lane holding its
part of the operands in 32-bit registers of two halves (the PTX ISA's fragment layout, with
``g = lane >> 2``, ``t = lane & 3``):

* ``a0``: A row ``g``, k ``2t, 2t+1``; ``a1``: row ``g+8``, same k; ``a2``: row ``g``, k
  ``2t+8, 2t+9``; ``a3``: row ``g+8``, k ``2t+8, 2t+9`` (the lower k in the low half);
* ``b0``: B column ``g``, k ``2t, 2t+1``; ``b1``: column ``g``, k ``2t+8, 2t+9``;
* ``c0, c1``: row ``g``, columns ``2t, 2t+1``; ``c2, c3``: row ``g+8``, same columns.

Three modes, by the target's ``tensor_cores`` (``Target("opencl -device=nvidia")``: ``"ptx"``;
``"opencl -device=nvidia-emulated"``: ``"emulated"``):

* ``"ptx"``: the ``asm volatile`` statement (the device must be NVIDIA, compute capability
  8.0 or more: the runtime refuses others before compiling, ``REQUIREMENT``);
* ``"emulated"``: a portable OpenCL C function computing exactly the mma's result from the
  same fragments: each lane puts its six operand words into a ``__local`` scratch of its warp
  (``EMULATION_SCRATCH`` words a lane, declared by the kernel), a work-group barrier, each lane
  sums its four outputs over k = 0..15 in float32 from the words of the lanes holding them, a
  barrier. It needs the mma in control flow uniform across the work-group (the kernel's is)
  and the warp to be 32 consecutive work-items of a 1-D work-group. It is for testing the
  kernels (indexing, fragment layouts, epilogues, edges) on a CPU driver such as PoCL; its
  speed means nothing;
* none: a kernel using the intrinsics is a ``CodegenError`` naming the targets that run it.

The fragment loads ``ldmatrix.sync.aligned.m8n8.x4`` / ``.x2`` (``.shared.b16``, each lane
giving one 16-byte row address of four / two 8 x 8 matrices of halves and receiving its word of
each, the same layout as an mma fragment) and the asynchronous copies ``cp.async.cg.shared.
global`` (16 bytes, with ``cp.async.commit_group`` / ``cp.async.wait_group n``) have the same two
forms. In the emulation the ldmatrix goes through the same ``__local`` scratch: each lane
reads the row it gives into it, a barrier, each lane takes its words from the rows the others
read (the layout is checked on PoCL). The row is read before that barrier, as the work-item
sees shared memory then, so a row another work-item has not yet made visible (a copy of its
not yet landed, or landed with no barrier since) reads stale, as it may on the hardware.

The emulated ``cp.async`` keeps its asynchrony (``CP_ASYNC_EMULATION_SOURCE``): the copy
reads its 16 source bytes when issued (global memory the kernel does not write) into a queue
private to the work-item (the value, the ``__local`` destination, the group: the number of
commits so far); a commit closes the group; ``wait_group n`` writes to shared memory every
queued copy of every committed group but the newest ``n`` (never the copies not yet
committed). So a copy is in shared memory only from its own work-item's wait on, and other
work-items see it only after a barrier that follows that wait. A CPU driver such as PoCL runs
a work-group's items one after another between barriers: a kernel that reads another item's
copies after its own wait and no barrier reads stale data there and fails, where a plain copy
passed (how the ring of ``relax.backend.gpu.tensor_core`` missed its barrier after the wait on
PoCL and gave wrong results on NVIDIA's driver). The queue holds the most copies a work-item
has pending at once, which ``cp_async_queue_capacity`` finds in the kernel's IR (following the
commits and waits through its conditionals and loops); a kernel where that has no bound is a
``CodegenError``.

A shared address of the PTX forms is the ``__local`` pointer's value as a 32-bit integer
(``(uint)(size_t)p``).

Examples
--------
>>> print(mma_asm(["c[0]", "c[1]", "c[2]", "c[3]"], ["a[0]", "a[1]", "a[2]", "a[3]"],
...               ["b[0]", "b[1]"]).split(" : ")[1])
"+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
"""
from __future__ import annotations

from typing import FrozenSet, Sequence, Tuple

from tilecraft.tensorir import expr as E
from tilecraft.tensorir import stmt as S
from tilecraft.tensorir.functor import IRFunctor, children

MODES = ("ptx", "emulated")

# The pseudo-extension an OpenCL module with inline PTX carries: the runtime checks it against
# the device (NVIDIA, compute capability >= 8.0) instead of the extension list.
REQUIREMENT = "tc_nvidia_ptx_sm80"

MMA_PTX = ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
           "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};")

# words of __local scratch a lane of the emulation uses (a0..a3, b0, b1)
EMULATION_SCRATCH = 6
SCRATCH_NAME = "tc_mma_scratch"

EMULATION_SOURCE = """// m16n8k16 mma (f16 x f16 -> f32) of one warp, emulated through __local memory: the same
// fragments and result as mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
inline float tc_half_of(__local const uint* s, int lane, int reg, int k) {
  return vload_half(2 * (lane * 6 + reg) + (k & 1), (__local const half*)s);
}
void tc_mma_emulated(__local uint* warp_scratch, float* c, const uint* a, const uint* b) {
  int lane = (int)(get_local_id(0) & 31);
  __local uint* s = warp_scratch + (get_local_id(0) >> 5) * (32 * 6);
  for (int i = 0; i < 4; ++i) s[lane * 6 + i] = a[i];
  s[lane * 6 + 4] = b[0];
  s[lane * 6 + 5] = b[1];
  barrier(CLK_LOCAL_MEM_FENCE);
  int g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; ++i) {
    int row = g + ((i >> 1) << 3);         // c0, c1: row g; c2, c3: row g + 8
    int col = 2 * t + (i & 1);
    float acc = c[i];
    for (int k = 0; k < 16; ++k) {
      // A[row][k]: lane (row % 8) * 4 + (k % 8) / 2, register (row >= 8) + 2 (k >= 8)
      float x = tc_half_of(s, (row & 7) * 4 + ((k & 7) >> 1), (row >> 3) + ((k >> 3) << 1), k);
      // B[k][col]: lane col * 4 + (k % 8) / 2, register 4 + (k >= 8)
      float y = tc_half_of(s, col * 4 + ((k & 7) >> 1), 4 + (k >> 3), k);
      acc = fma(x, y, acc);
    }
    c[i] = acc;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
}"""


LDMATRIX_PTX = "ldmatrix.sync.aligned.m8n8.x{n}.shared.b16"
CP_ASYNC_PTX = "cp.async.cg.shared.global [%0], [%1], 16;"

LDMATRIX_EMULATION_SOURCE = """// ldmatrix.sync.aligned.m8n8.x{1,2,4}(.trans).shared.b16 of one warp, emulated through
// __local memory: each lane giving a row (lanes 0 .. 8 n - 1) reads its row's four words into
// the warp's scratch, as this work-item sees shared memory (before the exchange's barrier: a
// row another work-item has not yet made visible reads stale, as on the hardware); lane l
// then takes word l % 4 of row l / 4 of each matrix r from the rows lanes 8 r.. read
void tc_ldmatrix_emulated(__local uint* warp_scratch, uint* d, __local const uint* base,
                          int index, int n, int trans) {
  int lane = (int)(get_local_id(0) & 31);
  __local uint* s = warp_scratch + (get_local_id(0) >> 5) * (32 * 6);
  if (lane < 8 * n)
    for (int w = 0; w < 4; ++w) s[lane * 4 + w] = base[index + w];
  barrier(CLK_LOCAL_MEM_FENCE);
  int g = lane >> 2, t = lane & 3;
  for (int r = 0; r < n; ++r) {
    if (trans) {          // column g of rows 2t and 2t + 1
      uint lo = s[(r * 8 + 2 * t) * 4 + (g >> 1)], hi = s[(r * 8 + 2 * t + 1) * 4 + (g >> 1)];
      int sh = (g & 1) * 16;
      d[r] = ((lo >> sh) & 0xffffu) | (((hi >> sh) & 0xffffu) << 16);
    } else {
      d[r] = s[(r * 8 + g) * 4 + t];
    }
  }
  barrier(CLK_LOCAL_MEM_FENCE);
}"""


def ldmatrix_asm(dst: Sequence[str], address: str, trans: bool = False) -> str:
    """The ``asm volatile`` statement of one ``ldmatrix .x1/.x2/.x4`` (by ``len(dst)``,
    ``.trans`` with ``trans``): the uint lvalues ``dst`` receive the lane's words;
    ``address`` is this lane's row, a ``__local`` pointer (its 32-bit shared-window address
    is the pointer's value)."""
    n = len(dst)
    op = LDMATRIX_PTX.format(n=n).replace(".shared", ".trans.shared" if trans else ".shared")
    regs = ",".join(f"%{i}" for i in range(n))
    outs = ", ".join(f'"=r"({x})' for x in dst)
    return (f'asm volatile("{op} {{{regs}}}, [%{n}];" : {outs} : '
            f'"r"((uint)(size_t)({address})));')


def ldmatrix_emulated(dst: str, base: str, index: str, n: int, trans: bool = False) -> str:
    """The call of the ldmatrix emulation: ``dst`` the address of the first private word,
    ``base`` the shared buffer, ``index`` this lane's row's word index in it."""
    return f"tc_ldmatrix_emulated({SCRATCH_NAME}, {dst}, {base}, {index}, {n}, {int(trans)});"


def cp_async_asm(dst: str, src: str) -> str:
    """``cp.async.cg`` of 16 bytes from the ``__global`` address ``src`` to the ``__local``
    address ``dst``."""
    return (f'asm volatile("{CP_ASYNC_PTX}" :: "r"((uint)(size_t)({dst})), '
            f'"l"((ulong)(size_t)({src})));')


# The emulated cp.async's queue: one work-item's pending copies, private arrays the kernel
# declares (``cp_queue_decls``), sized by ``cp_async_queue_capacity``
CP_QUEUE_NAME = "tc_cp_queue"
CP_PENDING_NAME = "tc_cp_pending"
CP_GROUP_NAME = "tc_cp_group"
# the most copies a work-item may have pending at once (16 bytes each, private memory)
CP_QUEUE_LIMIT = 256

CP_ASYNC_EMULATION_SOURCE = """// cp.async.cg.shared.global (16 bytes), cp.async.commit_group and
// cp.async.wait_group n of one work-item, emulated with their asynchrony: a copy reads its
// (global, read-only) source when issued into the work-item's queue of pending copies,
// tagged with the open group; a commit closes the open group (tc_cp_group += 1); wait n
// writes to shared memory, in issue order, every pending copy of every committed group but
// the newest n. Until then shared memory keeps its old value, and other work-items see a
// landed copy only after a barrier
typedef struct { uint4 value; __local uint4* dst; int group; } tc_cp_copy;
void tc_cp_async_emulated(tc_cp_copy* queue, int* pending, int group, __local void* dst,
                          __global const void* src) {
  queue[*pending].value = *((__global const uint4*)src);
  queue[*pending].dst = (__local uint4*)dst;
  queue[*pending].group = group;
  *pending += 1;
}
void tc_cp_wait_emulated(tc_cp_copy* queue, int* pending, int group, int n) {
  int kept = 0;
  for (int i = 0; i < *pending; ++i) {
    if (queue[i].group < group - n) *queue[i].dst = queue[i].value;
    else queue[kept++] = queue[i];
  }
  *pending = kept;
}"""


def cp_async_emulated(dst: str, src: str) -> str:
    """The call of the ``cp.async`` emulation: 16 bytes from the ``__global`` address ``src``
    queued for the ``__local`` address ``dst``."""
    return (f"tc_cp_async_emulated({CP_QUEUE_NAME}, &{CP_PENDING_NAME}, {CP_GROUP_NAME}, "
            f"{dst}, {src});")


def cp_commit_emulated() -> str:
    return f"{CP_GROUP_NAME} += 1;  // cp.async.commit_group"


def cp_wait_emulated(n: int) -> str:
    return (f"tc_cp_wait_emulated({CP_QUEUE_NAME}, &{CP_PENDING_NAME}, {CP_GROUP_NAME}, "
            f"{int(n)});")


def cp_queue_decls(capacity: int) -> list[str]:
    """The declarations of the emulated ``cp.async`` queue of ``capacity`` copies (at the top
    of the kernel: private to each work-item)."""
    return [f"tc_cp_copy {CP_QUEUE_NAME}[{capacity}];",
            f"int {CP_PENDING_NAME} = 0, {CP_GROUP_NAME} = 0;"]


# A state of the queue: (the pending copies of each committed group, oldest first, without
# leading empty groups; the copies of the open group)
_State = Tuple[Tuple[int, ...], int]
_CP_OPS = (E.TC_CP_ASYNC, E.TC_CP_COMMIT, E.TC_CP_WAIT)
_MAX_STATES = 4096       # distinct queue states a loop of unknown trip count may reach
_UNROLL_LIMIT = 1024     # loops of a constant trip count up to this are followed trip by trip


class _PendingCopies(IRFunctor):
    """The states the emulated queue of one work-item can be in, statement by statement
    (``visit(stmt, states) -> states``), and the most copies pending in any of them."""

    def __init__(self):
        self.most = 0
        self._has_cp: dict[int, bool] = {}

    def has_cp(self, node) -> bool:
        key = id(node)
        if key not in self._has_cp:
            if isinstance(node, S.Evaluate):
                self._has_cp[key] = isinstance(node.value, E.Call) and node.value.op in _CP_OPS
            else:
                self._has_cp[key] = any(self.has_cp(c) for c in children(node)
                                        if isinstance(c, S.Stmt))
        return self._has_cp[key]

    def visit_default(self, node, states: FrozenSet[_State]) -> FrozenSet[_State]:
        # a statement holding others (Allocate, LetStmt, AssertStmt, SeqStmt, ...): in order
        for c in children(node):
            if isinstance(c, S.Stmt) and self.has_cp(c):
                states = self.visit(c, states)
        return states

    def visit_IfThenElse(self, s: S.IfThenElse, states):
        if not self.has_cp(s):
            return states
        other = states if s.else_case is None else self.visit(s.else_case, states)
        return self.visit(s.then_case, states) | other

    def visit_For(self, s: S.For, states):
        if not self.has_cp(s.body):
            return states
        extent = E.as_int(s.extent)
        if s.kind == "thread_binding":     # one work-item runs the body once
            return self.visit(s.body, states)
        if extent is not None and extent <= _UNROLL_LIMIT:
            for _ in range(extent):
                after = self.visit(s.body, states)
                if after == states:        # every later trip gives the same states
                    break
                states = after
            return states
        # an unknown (or long) trip count: the states after any number of trips
        reached, frontier = states, states
        while frontier:
            frontier = self.visit(s.body, frontier) - reached
            reached |= frontier
            if len(reached) > _MAX_STATES:
                raise E.TIRError(f"the cp.async emulation cannot bound the copies and groups "
                                 f"pending in loop {s.loop_var.name} (commits without waits?)",
                                 s)
        return reached

    def visit_Evaluate(self, s: S.Evaluate, states):
        if not self.has_cp(s):
            return states
        op, args = s.value.op, s.value.args
        if op == E.TC_CP_ASYNC:
            states = frozenset((done, open_ + 1) for done, open_ in states)
            self.most = max([self.most] + [sum(done) + open_ for done, open_ in states])
            if self.most > CP_QUEUE_LIMIT:
                raise E.TIRError(f"the cp.async emulation: a work-item may have more than "
                                 f"{CP_QUEUE_LIMIT} copies pending (a copy in a loop without a "
                                 f"wait?)", s)
            return states
        if op == E.TC_CP_COMMIT:
            return frozenset((_strip(done + (open_,)), 0) for done, open_ in states)
        n = E.as_int(args[0])
        if n is None or n < 0:
            raise E.TIRError(f"{op} takes a constant number of groups >= 0, got {args[0]!r}", s)
        return frozenset((_strip(done[max(len(done) - n, 0):]), open_) for done, open_ in states)


def _strip(done: Tuple[int, ...]) -> Tuple[int, ...]:
    """``done`` without its leading empty groups (no wait can land anything of them)."""
    i = 0
    while i < len(done) and done[i] == 0:
        i += 1
    return done[i:]


def cp_async_queue_capacity(body: S.Stmt) -> int:
    """The most ``cp.async`` copies one work-item running ``body`` has pending (issued, not
    landed by a wait) at once: the capacity of the emulation's queue. Follows the commits and
    waits through the statements, both branches of a conditional and every trip of a loop (a
    loop of unknown trip count until its states repeat); a ``TIRError`` where that has no
    bound (more than ``CP_QUEUE_LIMIT`` copies, or groups growing without a wait).

    Examples
    --------
    >>> from tilecraft.tensorir.stmt import Buffer, Evaluate, seq
    >>> from tilecraft.tensorir.expr import call, const
    >>> G, sh = Buffer("G", (8,), "uint32"), Buffer("sh", (8,), "uint32", scope="shared")
    >>> copy = Evaluate(call(E.TC_CP_ASYNC, sh[0], G[0], dtype="int32"))
    >>> commit = Evaluate(call(E.TC_CP_COMMIT, dtype="int32"))
    >>> wait1 = Evaluate(call(E.TC_CP_WAIT, const(1, "int32"), dtype="int32"))
    >>> cp_async_queue_capacity(seq(copy, copy, commit, copy, commit, wait1, copy))
    3
    """
    walk = _PendingCopies()
    walk.visit(body, frozenset({((), 0)}))
    return walk.most


def cp_commit_asm() -> str:
    return 'asm volatile("cp.async.commit_group;");'


def cp_wait_asm(n: int) -> str:
    return f'asm volatile("cp.async.wait_group {int(n)};");'


def mma_asm(c: Sequence[str], a: Sequence[str], b: Sequence[str]) -> str:
    """The ``asm volatile`` statement of one m16n8k16 mma: ``c`` the four float accumulators'
    lvalues (read and written), ``a`` the four and ``b`` the two uint operand words."""
    outs = ", ".join(f'"+f"({x})' for x in c)
    ins = ", ".join(f'"r"({x})' for x in list(a) + list(b))
    return f'asm volatile("{MMA_PTX}" : {outs} : {ins});'


def mma_emulated(c: str, a: str, b: str) -> str:
    """The call of the emulation: ``c``, ``a``, ``b`` the addresses of the first accumulator,
    operand word of A and of B (private arrays)."""
    return f"tc_mma_emulated({SCRATCH_NAME}, {c}, {a}, {b});"


def load_b128(dst: str, dst_space: str, src: str, src_space: str) -> str:
    """16 bytes from address ``src`` into the four uint words from address ``dst`` (global
    and shared addresses 16-byte aligned; spaces ``__global`` / ``__local`` / ``""`` for
    private)."""
    # (a private array is not known to be 16-byte aligned: vload4 needs the element's only)
    load = f"vload4(0, ({src}))" if not src_space else f"(*(({src_space} const uint4*)({src})))"
    if dst_space:
        return f"*(({dst_space} uint4*)({dst})) = {load};"
    return f"vstore4({load}, 0, ({dst}));"


PACK_HALF2_SOURCE = """// two floats as float16 (to nearest even) in one word, the first in the low half
inline uint tc_pack_half2(float lo, float hi) {
  uint r;
  vstore_half2_rte((float2)(lo, hi), 0, (half*)&r);
  return r;
}"""


def pack_bits(lo: str, hi: str) -> str:
    """Two float16 values given as their bits (uints below 65536) in one word, ``lo`` in the
    low half (what ``tc_pack_half2`` makes of their float32 values, without converting)."""
    return f"(({lo}) | (({hi}) << 16))"


def pack_lo(a: str, b: str) -> str:
    """The low halves of two words as one (``a``'s in the low half)."""
    return f"((({a}) & 0xffffu) | (({b}) << 16))"


def pack_hi(a: str, b: str) -> str:
    """The high halves of two words as one (``a``'s in the low half)."""
    return f"((({a}) >> 16) | (({b}) & 0xffff0000u))"


# -- 3xTF32: float32 GEMMs on the TF32 tensor cores -------------------------------------------
#
# ``mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32`` (``tensorir.expr.TC_MMA_TF32``):
# A 16 x 8, B 8 x 8, C 16 x 8 float32, one tf32 (float32 bits, the low 13 ignored) a 32-bit
# register, ``g = lane >> 2``, ``t = lane & 3``:
#
# * ``a0``: A row ``g``, k ``t``; ``a1``: row ``g+8``, k ``t``; ``a2``: row ``g``, k ``t+4``;
#   ``a3``: row ``g+8``, k ``t+4``;
# * ``b0``: B k ``t``, column ``g``; ``b1``: k ``t+4``, column ``g``;
# * ``c`` as for m16n8k16.
#
# The split of a float32 ``x`` (``TC_TF32_BIG`` / ``TC_TF32_SMALL``): ``big = tf32(x)``
# (``cvt.rna.tf32.f32``: to nearest, ties away from zero), ``small = tf32(x - big)`` (the
# difference is exact in float32). The PTX form masks the low 13 bits of ``big``'s ``cvt``
# result, so that ``big`` read back as a float is exactly the tf32 value (``small``'s are left:
# the mma ignores them); the emulation rounds with integer operations to the same bits.
MMA_TF32_PTX = ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};")
CVT_TF32_PTX = "cvt.rna.tf32.f32 %0, %1;"

TF32_SPLIT_PTX_SOURCE = """// float32 -> tf32 (cvt.rna: to nearest, ties away), the low 13 bits cleared
inline uint tc_tf32_big(float x) {
  uint r;
  asm volatile("%s" : "=r"(r) : "f"(x));
  return r & 0xffffe000u;
}
// the remainder x - tf32(x) (exact in float32) as tf32 (its low 13 bits left as the cvt
// leaves them: the mma reads the upper 19 only)
inline uint tc_tf32_small(float x, uint big) {
  uint r;
  asm volatile("%s" : "=r"(r) : "f"(x - as_float(big)));
  return r;
}""" % (CVT_TF32_PTX, CVT_TF32_PTX)

TF32_SPLIT_EMULATED_SOURCE = """// float32 -> tf32 as cvt.rna.tf32.f32 computes it: to nearest, ties away from zero (half
// an ulp of the 10-bit mantissa added to the magnitude, then truncated), Inf kept, NaN a NaN
inline uint tc_tf32_big(float x) {
  uint b = as_uint(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return b | 0x7fffe000u;
  return (b + 0x1000u) & 0xffffe000u;
}
inline uint tc_tf32_small(float x, uint big) {
  return tc_tf32_big(x - as_float(big));
}"""

EMULATION_TF32_SOURCE = """// m16n8k8 mma (tf32 x tf32 -> f32) of one warp, emulated through __local memory: the same
// fragments as mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, the products (exact in
// float32) summed in float32 over k = 0..7 in order
void tc_mma_tf32_emulated(__local uint* warp_scratch, float* c, const uint* a, const uint* b) {
  int lane = (int)(get_local_id(0) & 31);
  __local uint* s = warp_scratch + (get_local_id(0) >> 5) * (32 * 6);
  for (int i = 0; i < 4; ++i) s[lane * 6 + i] = a[i];
  s[lane * 6 + 4] = b[0];
  s[lane * 6 + 5] = b[1];
  barrier(CLK_LOCAL_MEM_FENCE);
  int g = lane >> 2, t = lane & 3;
  for (int i = 0; i < 4; ++i) {
    int row = g + ((i >> 1) << 3);
    int col = 2 * t + (i & 1);
    float acc = c[i];
    for (int k = 0; k < 8; ++k) {
      // A[row][k]: lane (row % 8) * 4 + k % 4, register (row >= 8) + 2 (k >= 4)
      float x = as_float(s[((row & 7) * 4 + (k & 3)) * 6 + (row >> 3) + ((k >> 2) << 1)]
                         & 0xffffe000u);
      // B[k][col]: lane col * 4 + k % 4, register 4 + (k >= 4)
      float y = as_float(s[(col * 4 + (k & 3)) * 6 + 4 + (k >> 2)] & 0xffffe000u);
      acc = fma(x, y, acc);
    }
    c[i] = acc;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
}"""


def mma_tf32_asm(c: Sequence[str], a: Sequence[str], b: Sequence[str]) -> str:
    """The ``asm volatile`` statement of one m16n8k8 tf32 mma (operands as ``mma_asm``)."""
    outs = ", ".join(f'"+f"({x})' for x in c)
    ins = ", ".join(f'"r"({x})' for x in list(a) + list(b))
    return f'asm volatile("{MMA_TF32_PTX}" : {outs} : {ins});'


def mma_tf32_emulated(c: str, a: str, b: str) -> str:
    """The call of the tf32 mma's emulation (arguments as ``mma_emulated``)."""
    return f"tc_mma_tf32_emulated({SCRATCH_NAME}, {c}, {a}, {b});"


__all__ = ["CP_ASYNC_EMULATION_SOURCE", "CP_ASYNC_PTX", "CP_GROUP_NAME", "CP_PENDING_NAME",
           "CP_QUEUE_LIMIT", "CP_QUEUE_NAME", "CVT_TF32_PTX", "EMULATION_SCRATCH",
           "EMULATION_SOURCE", "EMULATION_TF32_SOURCE", "LDMATRIX_EMULATION_SOURCE",
           "LDMATRIX_PTX", "MMA_PTX", "MMA_TF32_PTX", "MODES", "PACK_HALF2_SOURCE", "REQUIREMENT",
           "SCRATCH_NAME", "TF32_SPLIT_EMULATED_SOURCE", "TF32_SPLIT_PTX_SOURCE", "cp_async_asm",
           "cp_async_emulated", "cp_async_queue_capacity", "cp_commit_asm", "cp_commit_emulated",
           "cp_queue_decls", "cp_wait_asm", "cp_wait_emulated", "ldmatrix_asm",
           "ldmatrix_emulated", "load_b128", "mma_asm", "mma_emulated", "mma_tf32_asm",
           "mma_tf32_emulated", "pack_hi", "pack_lo"]
