"""What ``torch.export.export`` gives by default, imported as it is: in-place and view operators
(functionalized by the importer), scatters, symbolic-int operators and torch's run-time
assertions, the ranges of ``Dim`` s, buffers and lifted constants, nested outputs.

Every model is compared with PyTorch eager on random inputs, exported as it is, under
``torch.no_grad()`` and after ``run_decompositions()``.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install "
                                            "'tilecraft[torch]'): the torch frontend needs it")
import torch.nn as nn                     # noqa: E402
import torch.nn.functional as F           # noqa: E402
import torch.utils._pytree as pytree      # noqa: E402

from tilecraft import relax, targets                          # noqa: E402
from tilecraft.relax.frontend import from_torch                     # noqa: E402

Dim = torch.export.Dim
MODES = ("export", "no_grad", "decomposed")
# torch 2.13 warns about its own pytree classes when decomposing
pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


def export(model, args, dynamic_shapes=None, mode="export", **kwargs):
    if mode == "no_grad":
        with torch.no_grad():
            return torch.export.export(model, args, dynamic_shapes=dynamic_shapes, **kwargs)
    ep = torch.export.export(model, args, dynamic_shapes=dynamic_shapes, **kwargs)
    return ep.run_decompositions() if mode == "decomposed" else ep


def check(model, args, dynamic_shapes=None, more_args=(), mode="export", rtol=1e-5, atol=1e-6,
          **kwargs):
    """Export, import, build; the outputs (flattened in order) match eager's on ``args`` and
    each of ``more_args``. Inputs are cloned for eager: the model may write into them."""
    model = model.eval()
    ep = export(model, tuple(a.clone() for a in args), dynamic_shapes, mode, **kwargs)
    mod = from_torch(ep)
    vm = relax.VirtualMachine(relax.build(mod, "llvm -opt-level=0", strict=True),
                              targets.cpu(0))
    for inputs in (tuple(args),) + tuple(more_args):
        with torch.no_grad():
            refs = pytree.tree_leaves(model(*[a.clone() for a in inputs]))
        out = vm["main"](*[a.numpy() for a in inputs])
        outs = out if isinstance(out, tuple) else (out,)
        assert len(outs) == len(refs)
        for o, r in zip(outs, refs):
            r = np.asarray(r.numpy() if isinstance(r, torch.Tensor) else r)
            o = o.numpy()
            assert o.shape == r.shape and o.dtype == r.dtype, (o.shape, o.dtype, r.shape, r.dtype)
            np.testing.assert_allclose(o, r, rtol=rtol, atol=atol)
    return mod, vm


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------------
# in-place operators and views


class WritesThroughViews(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 6))

    def forward(self, x, idx):
        y = x.clone()
        y[:, 0] = 1.0                        # select + fill_
        y.add_(x * self.scale)               # add_ on the base
        v = y.view(-1, 2)
        v.mul_(2)                            # through a reshape view
        z = y.transpose(0, 1)
        z[1:3].zero_()                       # through transpose then slice
        y.masked_fill_(y > 3, 0.5)
        y[idx] = 7.0                         # index_put_ with an index tensor
        a, b = y.split(3, dim=1)
        b.sub_(a)                            # through one result of split
        w = torch.relu_(y.detach())          # detach is a view: relu_ writes y too
        t = y.to(torch.float32)              # the same tensor
        t.add_(0.25)
        y[-1].unsqueeze(0).t()[::2].fill_(-3.0)     # select, unsqueeze, t, strided slice
        y.diagonal(1).copy_(torch.arange(4.0))      # diagonal
        return y, v, w


@pytest.mark.parametrize("mode", MODES)
def test_in_place_writes_through_views(mode):
    x = randn(4, 6)
    check(WritesThroughViews(), (x, torch.tensor([0, 2])), mode=mode,
          more_args=[(randn(4, 6, seed=1), torch.tensor([3, -1]))])


class InPlaceOnInputsAndBuffers(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(3))
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        x.mul_(2)                            # the caller's tensor (torch writes it back)
        self.total.add_(x.sum(0))            # a buffer (a running statistic)
        h = self.lin(x)
        h.clamp_(min=-0.5).sigmoid_()
        return h + self.total, x


@pytest.mark.parametrize("mode", MODES)
def test_in_place_on_inputs_and_buffers(mode):
    torch.manual_seed(0)
    model = InPlaceOnInputsAndBuffers()
    batch = Dim("batch", max=16)
    x = randn(5, 3)
    ep = export(model, (x.clone(),), ({0: batch},), mode)
    mod = from_torch(ep)
    vm = relax.VirtualMachine(relax.build(mod, "llvm -opt-level=0", strict=True),
                              targets.cpu(0))
    for inp in (x, randn(2, 3, seed=3)):
        fresh = InPlaceOnInputsAndBuffers()
        fresh.load_state_dict(model.state_dict())     # the buffer as it was when exported
        with torch.no_grad():
            ref = fresh(inp.clone())
        out = vm["main"](inp.numpy())
        for o, r in zip(out, ref):
            np.testing.assert_allclose(o.numpy(), r.numpy(), rtol=1e-5, atol=1e-6)


class Scatters(nn.Module):
    def forward(self, x, src, rows, mask):
        y = x.clone()
        y[:, 1:5:2] = src                          # slice_scatter with a step
        y[:, 2] = src[:, 0]                        # select_scatter
        y[-2] = x[0] * 2
        y.index_put_((rows,), src[:1, :1] * 3, accumulate=True)   # duplicates add up
        y[mask] = -1.0                             # a bool mask, one value
        z = x.clone()
        z[rows, rows] = 5.0                        # two index tensors
        flat = x.clone().as_strided((3, 2), (2, 1), 4)    # a view of a contiguous tensor
        return y, z, flat * 2, torch.diff(x, dim=1, prepend=x[:, :1])


@pytest.mark.parametrize("mode", MODES)
def test_scatters_index_put_as_strided_diff(mode):
    x, src = randn(5, 6), randn(5, 2, seed=1)
    rows = torch.tensor([1, 3, 1])
    mask = x > 1.0
    check(Scatters(), (x, src, rows, mask), mode=mode)


class ViewThenWriteBase(nn.Module):
    def forward(self, x):
        y = x + 0
        col = y[:, 1]                  # a view read after the base is written: it must change
        y.mul_(3)
        return col + 1, y.reshape(-1)[::5]


@pytest.mark.parametrize("mode", ("export", "decomposed"))
def test_views_see_later_writes_to_their_base(mode):
    batch = Dim("batch", max=32)
    check(ViewThenWriteBase(), (randn(4, 3),), ({0: batch},), mode=mode,
          more_args=[(randn(9, 3, seed=2),)])


# ---------------------------------------------------------------------------------------------
# attention


class Attention(nn.Module):
    def forward(self, q, k, v, bool_mask, float_mask):
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b = F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask)
        c = F.scaled_dot_product_attention(q, k, v, attn_mask=float_mask, scale=0.3)
        return a, b, c


@pytest.mark.parametrize("mode", MODES)
def test_scaled_dot_product_attention_masks_and_causal(mode):
    q, k, v = randn(2, 3, 5, 8), randn(2, 3, 7, 8, seed=1), randn(2, 3, 7, 8, seed=2)
    bool_mask = randn(2, 1, 5, 7, seed=3) > -0.5
    bool_mask[..., 0] = True                   # no row fully masked
    float_mask = randn(5, 7, seed=4)
    check(Attention(), (q, k, v, bool_mask, float_mask), mode=mode, rtol=1e-4, atol=1e-5)


class GroupedAttention(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def test_grouped_query_attention_dynamic_sequence():
    seq = Dim("seq", max=32)
    q, k, v = randn(1, 4, 6, 8), randn(1, 2, 6, 8, seed=1), randn(1, 2, 6, 8, seed=2)
    check(GroupedAttention(), (q, k, v), ({2: seq}, {2: seq}, {2: seq}), rtol=1e-4, atol=1e-5,
          more_args=[(randn(1, 4, 11, 8, seed=5), randn(1, 2, 11, 8, seed=6),
                      randn(1, 2, 11, 8, seed=7))])


# ---------------------------------------------------------------------------------------------
# symbolic ints, torch's assertions, Dim ranges


class SymbolicInts(nn.Module):
    def forward(self, x, y):
        n = x.numel()                           # sym_numel
        flat = x.reshape(-1)[: y.shape[0]]      # torch assumes y.shape[0] <= 3 * x.shape[0]
        return flat * 2, n, x.new_full((2,), x.shape[0])


def test_symbolic_ints_and_deferred_assertions():
    dims = ({0: Dim("a", max=64)}, {0: Dim("b", max=64)})
    model = SymbolicInts()
    x, y = randn(4, 3), randn(5)
    # torch's guards as _assert_scalar nodes: b <= 3 * a is checked when the model runs
    mod, vm = check(model, (x, y), dims, more_args=[(randn(7, 3), randn(20))],
                    prefer_deferred_runtime_asserts_over_guards=True)
    assert "R.assert_op" in mod["main"].script()
    with pytest.raises(relax.RuntimeCheckError, match=r"b <= 3 \* a, but b = 9, a = 2 \(node "
                                                      r"_assert_scalar"):
        vm["main"](randn(2, 3).numpy(), randn(9).numpy())


def test_symbolic_slice_checked_without_deferred_assertions():
    # exported as usual, the guard is not in the graph; the importer finds the slice's shape
    # (torch: b) and its own (min(b, 3 * a)) differ and checks what makes them equal
    dims = ({0: Dim("a", max=64)}, {0: Dim("b", max=64)})
    _, vm = check(SymbolicInts(), (randn(4, 3), randn(5)), dims)
    with pytest.raises(relax.RuntimeCheckError, match=r"b <= a \* 3.*at test_export_"
                                                      r"semantics\.py:\d+: flat = "):
        vm["main"](randn(2, 3).numpy(), randn(9).numpy())


class PositionTable(nn.Module):
    """BERT's embeddings: a position table of 16 rows sliced by the sequence length."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(16, 4)
        self.register_buffer("positions", torch.arange(16)[None], persistent=False)

    def forward(self, ids):
        pos = self.positions[:, : ids.shape[1]].expand(ids.shape[0], -1)
        return self.emb(pos) + ids[..., None]


def test_dim_range_proves_shapes_and_is_checked_at_run_time():
    dims = ({0: Dim("batch", max=8), 1: Dim("seq", min=2, max=12)},)
    ids = torch.randint(0, 5, (2, 7)).float()
    mod, vm = check(PositionTable(), (ids,), dims, more_args=[(torch.rand(3, 12),),
                                                            (torch.rand(1, 2),)])
    main = mod["main"]
    assert dict(main.attr_dict["tir_var_upper_bound"]) == {"batch": 8, "seq": 12}
    assert dict(main.attr_dict["tir_var_lower_bound"]) == {"seq": 2}
    # seq <= 12 < 16 proves min(seq, 16) == seq: no other check than the ranges'
    assert main.script().count("R.assert_op") == 2
    with pytest.raises(relax.RuntimeCheckError,
                       match=r"^ids\.shape\[1\] = seq = 13 is outside the range \[2, 12\] the "
                             r"model was exported for \(torch\.export\.Dim\('seq', min=2, "
                             r"max=12\)\)$"):
        vm["main"](torch.rand(2, 13).numpy())
    with pytest.raises(relax.RuntimeCheckError, match="seq = 1 is outside"):
        vm["main"](torch.rand(2, 1).numpy())


# ---------------------------------------------------------------------------------------------
# outputs


@dataclasses.dataclass
class Result:
    logits: torch.Tensor
    hidden: tuple
    extra: dict


try:
    pytree.register_dataclass(Result)
except (AttributeError, ValueError):     # registered already (the module imported twice)
    pass


class NestedOutputs(nn.Module):
    def forward(self, x):
        return Result(logits=x * 2, hidden=(x + 1, x.sum(1)), extra={"b": x - 1, "a": x.T})


def test_dataclass_tuple_dict_outputs_flattened_in_order():
    x = randn(3, 4)
    mod, vm = check(NestedOutputs(), (x,), ({0: Dim("batch", max=8)},),
                    more_args=[(randn(5, 4, seed=1),)])
    assert len(vm["main"](x.numpy())) == 5


class EveryOther(nn.Module):
    def forward(self, x, y):
        return x[:, ::2] + y


def test_derived_dim():
    # what torch suggests for a ConstraintViolationError: x's dim is 2 * y's
    h = Dim("h", max=32)
    mod, vm = check(EveryOther(), (randn(3, 8), randn(3, 4)), ({1: 2 * h}, {1: h}),
                    more_args=[(randn(3, 10, seed=1), randn(3, 5, seed=2))])
    with pytest.raises(relax.RuntimeCheckError, match=r"^y\.shape\[1\] = h = 33 is outside"):
        vm["main"](randn(3, 66).numpy(), randn(3, 33).numpy())
    with pytest.raises(ValueError, match="dimension 1"):       # the VM's own argument check
        vm["main"](randn(3, 9).numpy(), randn(3, 5).numpy())
