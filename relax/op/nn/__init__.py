"""Neural-network operators, as ``relax.op.nn`` in TVM: activations and softmax
(``activation``), normalizations (``norm``), convolutions (``conv``) and pooling (``pool``).

Examples
--------
>>> from tilecraft.relax import Var, TensorStructInfo
>>> from tilecraft.relax.op import nn
>>> x = Var("x", TensorStructInfo(("n", 10), "float32"))
>>> nn.relu(x).struct_info
Tensor((n, 10), 'float32')
"""
from .activation import *
from .norm import *
from .conv import *
from .pool import *
