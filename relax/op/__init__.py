"""Relax operators: ``relax.op.add(x, y)``, ``relax.op.matmul(a, b)``, ``relax.op.nn.relu(x)``...

Each operator is registered in ``relax.op.base`` with a struct-info inference function, a
legalization to ``tensorir.te`` and a fusion pattern kind. ``Op.list_ops()`` lists them.
"""
from .base import Op, OpPattern, call, get, register_op
from . import builtin
from .linear_algebra import *
from . import image
from . import elementwise, reduction, nn
from .elementwise import *
from .reduction import *
from .manipulate import *
from .index import *
from .create import *
from .misc import *
from .check import *
from .quantize import *
