"""The schedule language of TensorIR: ``Schedule``, its random variables, traces and errors."""
from .error import ScheduleError
from .intrinsics import TensorIntrin
from .rv import BlockRV, ExprRV, Instruction, LoopRV
from .schedule import Schedule, Trace
from .templates import KernelTemplate

__all__ = ["Schedule", "ScheduleError", "TensorIntrin", "KernelTemplate", "BlockRV", "LoopRV", "ExprRV", "Trace", "Instruction"]
