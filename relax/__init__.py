"""relax: the graph-level IR of tilecraft, with symbolic shapes.

Build a model with ``BlockBuilder`` (or import one with ``relax.frontend``), leaving dims such as
``batch`` or ``seq_len`` symbolic; ``relax.build(mod, target)`` optimizes and compiles it;
``relax.VirtualMachine(exe, device)`` runs it for any size.
"""
from .struct_info import (FuncStructInfo, ObjectStructInfo, PrimStructInfo, ShapeStructInfo,
                          StructInfo, TensorStructInfo, TupleStructInfo)
from .expr import (Binding, BindingBlock, Call, Constant, DataflowBlock, DataflowVar, Expr,
                   ExternFunc, Function, GlobalVar, If, MatchCast, PrimValue, RelaxError, SeqExpr,
                   ShapeExpr, StringImm, Tuple, TupleGetItem, Var, VarBinding, const)
from . import op
from .block_builder import BlockBuilder, call_tir
from tilecraft.tensorir.function import IRModule
from . import analysis, printer, transform
from .transform import get_pipeline
from .build import build
from .vm import VMArgumentError, VirtualMachine
from .vm_builtins import RuntimeCheckError
from .executable import Executable, load_executable
from .tune import extract_tasks, tune
from .tune_layouts import tune_layouts
from . import calibrate
from .quantize import quantize
