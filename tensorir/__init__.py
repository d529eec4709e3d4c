"""tensorir: the loop-level IR of tilecraft.

Expressions (``tensorir.expr``), statements and buffers (``tensorir.stmt``), functions
(``PrimFunc``, ``IRModule``), the compute DSL ``tensorir.te``, integer analysis
(``tensorir.arith``), lowering (``tensorir.transform``), a text form (``func.script()`` /
``tensorir.parse``) and a numpy reference interpreter (``tensorir.interpret``).

This package depends on numpy alone.
"""
from . import dtype
from .expr import (Add, And, BinaryOp, BufferLoad, Call, Cast, CmpOp, Div, EQ, FloatImm, FloorDiv,
                   FloorMod, GE, GT, IntImm, LE, LT, Let, Max, Min, Mod, Mul, NE, Node, Not, Or,
                   PrimExpr, Reduce, Select, StringImm, Sub, TIRError, Var, const, convert,
                   floordiv, floormod, max_value, min_value, truncdiv, truncmod, var)
from .stmt import (Allocate, AssertStmt, Block, BlockRealize, Buffer, BufferRegion, BufferStore,
                   Evaluate, For, IfThenElse, IterVar, LetStmt, Range, SeqStmt, Stmt, decl_buffer,
                   is_prefetch, prefetch, seq)
from .function import IRModule, PrimFunc
# structural and script register hashing / equality and printing with the nodes (see expr.py)
from .structural import assert_structural_equal, structural_equal, structural_hash
from . import script
from .functor import IRMutator, IRVisitor, post_order_visit, substitute
from . import arith
from . import te
from . import transform
from .parser import ParseError, parse
from .interpret import interpret
from .schedule import BlockRV, ExprRV, LoopRV, Schedule, ScheduleError, Trace

__all__ = [n for n in dir() if not n.startswith("_")]
