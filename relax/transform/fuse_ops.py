"""``FuseOps``: group the bindings of each dataflow block into fused functions, with TVM's
algorithm (Relay/Relax ``FuseOps``: a post-dominator tree over the dataflow graph and a
three-phase partitioner driven by each operation's pattern kind).

The pattern of a binding is that of its operator (``relax.op.OpPattern``); for ``call_tir`` it is
the kernel's ``"op_pattern"`` attribute (set by ``LegalizeOps``), else what
``relax.analysis.infer_op_pattern`` reads off the kernel. Tuples are TUPLE, tuple items
INJECTIVE, anything else OPAQUE.

A node is fused into its immediate post-dominator when every path between them allows it:

- phase 0: an OUT_EWISE_FUSABLE node (matmul, conv) takes the ELEMWISE/BROADCAST chain after it
  (its epilogue), when the edge to the post-dominator is element-wise;
- every phase: ELEMWISE/BROADCAST nodes fuse forward into INJECTIVE, COMM_REDUCE or already
  fused groups (so a reduction takes its element-wise inputs);
- phase 1: INJECTIVE nodes (and tuples) fuse forward through injective paths;
- phase 2: injective nodes fuse into tuples that were fused into injective consumers.

OPAQUE nodes never fuse; a value also used outside the group (several consumers without a common
post-dominator, or a variable that leaves the dataflow block) ends the group. Groups of one
binding stay as they are. Each other group becomes a function marked ``Primitive=1`` named after
what it computes (``fused_matmul_add_relu``), called where the group's last binding was;
identical groups share one function.

Examples
--------
>>> # lv = R.call_tir(cls.matmul, (x, w)); lv1 = R.call_tir(cls.add, (lv, b));
>>> # gv = R.call_tir(cls.relu, (lv1,))       becomes      gv = cls.fused_matmul_add_relu(x, w, b)
>>> # new_mod = FuseOps()(mod)
"""
from __future__ import annotations

from tilecraft.tensorir.function import IRModule, PrimFunc
from tilecraft.tensorir.structural import structural_equal, structural_hash

from ..analysis import free_vars, infer_op_pattern, is_call_tir, is_primitive
from ..expr import (Call, Constant, DataflowBlock, DataflowVar, Expr, Function, GlobalVar,
                    MatchCast, SeqExpr, Tuple, TupleGetItem, Var, VarBinding)
from ..op.base import Op, OpPattern
from ..struct_info import TensorStructInfo, TupleStructInfo
from .base import Pass

__all__ = ["FuseOps"]

ELEMWISE, BROADCAST, INJECTIVE = OpPattern.ELEMWISE, OpPattern.BROADCAST, OpPattern.INJECTIVE
COMM_REDUCE, OUT_EWISE_FUSABLE = OpPattern.COMM_REDUCE, OpPattern.OUT_EWISE_FUSABLE
TUPLE, OPAQUE = OpPattern.TUPLE, OpPattern.OPAQUE


class FuseOps(Pass):
    """Fuse the operations of each dataflow block into ``Primitive`` functions.

    Parameters
    ----------
    fuse_opt_level : int
        0 turns fusion off (the module is returned unchanged), as in TVM.
    max_fuse_depth : int
        The largest number of bindings in one group.

    Examples
    --------
    >>> new_mod = FuseOps()(LegalizeOps()(mod))   # doctest: +SKIP
    """

    name = "FuseOps"

    def __init__(self, fuse_opt_level: int = 2, max_fuse_depth: int = 256):
        self.fuse_opt_level = fuse_opt_level
        self.max_fuse_depth = max_fuse_depth

    def transform_module(self, mod: IRModule) -> IRModule:
        if self.fuse_opt_level <= 0:
            return mod
        fuser = _ModuleFuser(mod, self.max_fuse_depth)
        return fuser.run()


# ---------------------------------------------------------------------------------------------
# the indexed forward graph and its post-dominator tree


class _Node:
    __slots__ = ("index", "ref", "binding", "pattern", "outputs", "extern_ref")

    def __init__(self, index, ref, binding, pattern, extern_ref=False):
        self.index = index
        self.ref = ref                # the binding variable, or a leaf expression
        self.binding = binding        # the binding for a binding node, None for a leaf
        self.pattern = pattern
        self.outputs: list[tuple[_Node, int]] = []  # (consumer, edge pattern)
        self.extern_ref = extern_ref


class _DomNode:
    __slots__ = ("gnode", "parent", "depth", "pattern")

    def __init__(self, gnode, parent, depth, pattern):
        self.gnode, self.parent, self.depth, self.pattern = gnode, parent, depth, pattern


def _combine(a: int, b: int) -> int:
    if a > BROADCAST and b > BROADCAST:
        return OPAQUE
    return max(a, b)


class _Graph:
    """The dataflow graph of one dataflow block, nodes in topological (binding) order."""

    def __init__(self, block: DataflowBlock, pattern_of):
        self.nodes: list[_Node] = []
        self.node_of: dict[int, _Node] = {}
        self._keep: list = []
        for b in block.bindings:
            pattern, inputs = pattern_of(b)
            leaf_nodes = [(self._leaf(e), edge) for e, edge in inputs]
            node = self._add(b.var, b, pattern, extern_ref=not isinstance(b.var, DataflowVar))
            for leaf, edge in leaf_nodes:
                if leaf is not None:
                    leaf.outputs.append((node, edge))

    def _add(self, ref, binding, pattern, extern_ref=False) -> _Node:
        node = _Node(len(self.nodes), ref, binding, pattern, extern_ref)
        self.nodes.append(node)
        self.node_of[id(ref)] = node
        self._keep.append(ref)
        return node

    def _leaf(self, e: Expr):
        node = self.node_of.get(id(e))
        if node is not None:
            return node
        if isinstance(e, (Var, Constant)):
            # parameters, variables of earlier blocks and constants: inputs, never fused
            return self._add(e, None, OPAQUE)
        return None

    def post_dominator_tree(self) -> list[_DomNode]:
        tree: list[_DomNode | None] = [None] * len(self.nodes)
        for node in reversed(self.nodes):
            if node.extern_ref or not node.outputs:
                tree[node.index] = _DomNode(node, None, 1, OPAQUE if node.extern_ref else ELEMWISE)
                continue
            pattern = ELEMWISE
            parent = None
            first = True
            for consumer, edge in node.outputs:
                cnode = tree[consumer.index]
                if first:
                    parent, first = cnode, False
                else:
                    parent, pattern = _lca(parent, cnode, pattern)
                pattern = _combine(pattern, edge)
            tree[node.index] = _DomNode(node, parent, parent.depth + 1 if parent else 1, pattern)
        return tree


def _lca(lhs, rhs, pattern):
    while lhs is not rhs:
        if lhs is None or rhs is None:
            return None, pattern
        if lhs.depth < rhs.depth:
            pattern = _combine(pattern, rhs.pattern)
            rhs = rhs.parent
        elif rhs.depth < lhs.depth:
            pattern = _combine(pattern, lhs.pattern)
            lhs = lhs.parent
        else:
            pattern = _combine(pattern, lhs.pattern)
            pattern = _combine(pattern, rhs.pattern)
            lhs, rhs = lhs.parent, rhs.parent
    return lhs, pattern


# ---------------------------------------------------------------------------------------------
# the partitioner (TVM's GraphPartitioner)


class _Group:
    __slots__ = ("parent", "pattern", "root_ref", "anchor_ref", "num_nodes")

    def __init__(self, pattern, ref):
        self.parent = None
        self.pattern = pattern
        self.root_ref = ref
        self.anchor_ref = ref if pattern == OUT_EWISE_FUSABLE else None
        self.num_nodes = 1

    def find_root(self) -> "_Group":
        root = self
        while root.parent is not None:
            root = root.parent
        node = self
        while node.parent is not None:  # path compression
            nxt = node.parent
            node.parent = root if nxt is not root else nxt
            node = nxt
        return root


class _Partitioner:
    def __init__(self, graph: _Graph, max_fuse_depth: int):
        self.graph = graph
        self.max_fuse_depth = max_fuse_depth
        self.groups = [_Group(n.pattern, n.ref) for n in graph.nodes]
        self.visited: set[int] = set()

    def partition(self) -> list[_Group]:
        tree = self.graph.post_dominator_tree()
        for phase in range(3):
            self._run_fuse(tree, phase)
        return [g.find_root() for g in self.groups]

    # -- helpers --------------------------------------------------------------------------------
    def _merge(self, child: _Group, parent: _Group):
        child, parent = child.find_root(), parent.find_root()
        if child is parent:
            return
        parent.num_nodes += child.num_nodes
        child.parent = parent
        if child.anchor_ref is not None:
            parent.anchor_ref = child.anchor_ref
            parent.pattern = _combine(child.pattern, parent.pattern)

    def _check_path_rec(self, src: _Node, sink: _Node, fcond) -> bool:
        if src.index in self.visited:
            return True
        self.visited.add(src.index)
        group = self.groups[src.index].find_root()
        if not fcond(group.pattern, src is sink):
            return False
        if src is sink:
            return True
        return all(self._check_path_rec(c, sink, fcond) for c, _ in src.outputs)

    def _check_path(self, src: _Node, sink: _Node, fcond) -> bool:
        self.visited = set()
        return all(self._check_path_rec(c, sink, fcond) for c, _ in src.outputs)

    def _commit_rec(self, src: _Node, sink: _Node, target: _Group):
        if src is sink or src.index in self.visited:
            return
        self.visited.add(src.index)
        self._merge(self.groups[src.index], target)
        for c, _ in src.outputs:
            self._commit_rec(c, sink, target)

    def _commit(self, src: _Node, sink: _Node):
        target = self.groups[sink.index]
        self.visited = set()
        self._commit_rec(src, sink, target)

    def _count_rec(self, src: _Node, sink: _Node) -> int:
        if src is sink or src.index in self.visited:
            return 0
        self.visited.add(src.index)
        total = self.groups[src.index].find_root().num_nodes
        for c, _ in src.outputs:
            total += self._count_rec(c, sink)
        return total

    def _count_with_child(self, child: _Node, parent: _Node) -> int:
        self.visited = set()
        return self.groups[parent.index].find_root().num_nodes + self._count_rec(child, parent)

    # -- the phases -----------------------------------------------------------------------------
    def _run_fuse(self, tree, phase: int):
        for nid, gnode in enumerate(self.graph.nodes):
            dom = tree[nid]
            group = self.groups[nid]
            if group.pattern == OPAQUE or dom.parent is None:
                continue
            parent = dom.parent.gnode
            if self._count_with_child(gnode, parent) > self.max_fuse_depth:
                continue
            if phase == 2:
                if group.pattern > INJECTIVE:
                    continue
                pgroup = self.groups[parent.index]
                proot = pgroup.find_root()
                if proot.pattern == TUPLE:
                    continue
                if pgroup.pattern == TUPLE and proot.pattern <= INJECTIVE:
                    if self._check_path(gnode, parent, lambda k, sink: k <= INJECTIVE):
                        self._commit(gnode, parent)
                continue
            if group.find_root() is self.groups[parent.index].find_root():
                continue
            if self.groups[parent.index].pattern == TUPLE:
                continue
            if group.pattern == OUT_EWISE_FUSABLE:
                if phase != 0:
                    continue
                if dom.pattern == ELEMWISE:
                    if self._check_path(gnode, parent, lambda k, sink: k <= BROADCAST):
                        self._commit(gnode, parent)
            elif group.pattern <= BROADCAST:
                if dom.pattern <= INJECTIVE or dom.pattern == COMM_REDUCE:
                    def fcond(k, is_sink):
                        if not is_sink:
                            return k <= INJECTIVE
                        return k <= BROADCAST or k in (COMM_REDUCE, INJECTIVE, OUT_EWISE_FUSABLE)
                    if self._check_path(gnode, parent, fcond):
                        self._commit(gnode, parent)
            elif group.pattern in (INJECTIVE, TUPLE):
                if phase != 1:
                    continue
                if self._check_path(gnode, parent, lambda k, sink: k <= INJECTIVE):
                    self._commit(gnode, parent)
            # COMM_REDUCE: nothing fuses after a reduction


# ---------------------------------------------------------------------------------------------
# rewriting the module


def _short_op_name(name: str) -> str:
    return name.rsplit(".", 1)[-1]


class _ModuleFuser:
    def __init__(self, mod: IRModule, max_fuse_depth: int):
        self.mod = mod
        self.max_fuse_depth = max_fuse_depth
        self.funcs = dict(mod.functions)
        self.pattern_cache: dict[str, int] = {}
        self.by_hash: dict[int, list[tuple[str, Function]]] = {}

    def run(self) -> IRModule:
        changed = False
        for name, f in list(self.mod.functions.items()):
            if isinstance(f, Function) and not is_primitive(f):
                new = self.fuse_function(f)
                if new is not f:
                    self.funcs[name] = new
                    changed = True
        return IRModule(self.funcs) if changed else self.mod

    # -- patterns -------------------------------------------------------------------------------
    def kernel_pattern(self, name: str) -> int:
        if name not in self.pattern_cache:
            func = self.mod.functions.get(name)
            if not isinstance(func, PrimFunc):
                p = OPAQUE
            elif "op_pattern" in func.attr_dict:
                p = int(func.attr_dict["op_pattern"])
            else:
                p = infer_op_pattern(func)
            self.pattern_cache[name] = p
        return self.pattern_cache[name]

    def pattern_of(self, b):
        """(pattern kind, [(input expression, edge pattern)]) of a binding.

        An input of a BROADCAST operation that already has the result's shape is an
        element-wise edge (as in TVM), so ``matmul -> add(bias) -> relu`` fuses.
        """
        v = b.value
        if isinstance(b, MatchCast):
            return OPAQUE, [(v, OPAQUE)]
        if not _is_tensor_like(b.var.struct_info):
            return OPAQUE, [(a, OPAQUE) for a in free_vars(v)]
        if is_call_tir(v) and isinstance(v.args[1], Tuple):
            pattern, ins = self.kernel_pattern(v.args[0].name_hint), list(v.args[1].fields)
        elif isinstance(v, Call) and isinstance(v.op, Op):
            pattern, ins = int(v.op.pattern), _flat_inputs(list(v.args))
        elif isinstance(v, Tuple):
            pattern, ins = TUPLE, list(v.fields)
        elif isinstance(v, TupleGetItem):
            pattern, ins = INJECTIVE, [v.tuple_value]
        elif isinstance(v, Call):
            pattern, ins = OPAQUE, _flat_inputs(list(v.args))
        else:
            # a variable, constant, If, function...: opaque, fed by every variable it uses
            pattern, ins = OPAQUE, [v] if isinstance(v, (Var, Constant)) else free_vars(v)
        out_si = b.var.struct_info
        edges = []
        for a in ins:
            edge = pattern
            if pattern == BROADCAST and _same_shape(a.struct_info, out_si):
                edge = ELEMWISE
            edges.append((a, edge))
        return pattern, edges

    # -- one function ------------------------------------------------------------------------------
    def fuse_function(self, f: Function) -> Function:
        seq = f.body
        if not isinstance(seq, SeqExpr):
            return f
        # where each variable is used: (block index, binding index); the body counts as last
        uses: dict[int, list[tuple[int, int]]] = {}
        for bi, blk in enumerate(seq.blocks):
            for k, b in enumerate(blk.bindings):
                for v in free_vars(b.value):
                    uses.setdefault(id(v), []).append((bi, k))
        for v in free_vars(seq.body):
            uses.setdefault(id(v), []).append((len(seq.blocks), 0))
        blocks, changed = [], False
        for bi, blk in enumerate(seq.blocks):
            if isinstance(blk, DataflowBlock):
                new = self.fuse_block(bi, blk, uses)
                changed |= new is not blk
                blocks.append(new)
            else:
                blocks.append(blk)
        if not changed:
            return f
        return f.replace(body=SeqExpr(blocks, seq.body))

    def fuse_block(self, bi: int, blk: DataflowBlock, uses) -> DataflowBlock:
        graph = _Graph(blk, self.pattern_of)
        roots = _Partitioner(graph, self.max_fuse_depth).partition()
        members: dict[int, list[int]] = {}   # id(root group) -> binding indices, in order
        position = {id(b.var): k for k, b in enumerate(blk.bindings)}
        for node, root in zip(graph.nodes, roots):
            if node.binding is not None:
                members.setdefault(id(root), []).append(position[id(node.ref)])
        replace_at: dict[int, list] = {}     # binding index -> new bindings emitted there
        removed: set[int] = set()
        for idx in members.values():
            if len(idx) < 2:
                continue
            bindings = [blk.bindings[k] for k in sorted(idx)]
            if not any(isinstance(b.value, Call) for b in bindings):
                continue
            new = self.make_group_call(bi, sorted(idx), bindings, uses)
            if new is None:
                continue
            removed.update(idx)
            replace_at[max(idx)] = new
        if not removed:
            return blk
        out = []
        for k, b in enumerate(blk.bindings):
            if k in replace_at:
                out.extend(replace_at[k])
            elif k not in removed:
                out.append(b)
        return DataflowBlock(out)

    def make_group_call(self, bi: int, idx: list[int], bindings, uses):
        member_ids = {id(b.var) for b in bindings}
        member_pos = set((bi, k) for k in idx)
        last = max(idx)
        # outputs: members used outside the group (later bindings, later blocks, the body) or
        # that leave the block
        outputs = []
        for b in bindings:
            outside = [u for u in uses.get(id(b.var), []) if u not in member_pos]
            if outside or not isinstance(b.var, DataflowVar):
                if any(u[0] == bi and u[1] < last for u in outside):
                    return None  # used before the fused call could run: leave the group
                outputs.append(b.var)
        if not outputs:
            return None
        inputs: list[Var] = []
        seen: set[int] = set()
        for b in bindings:
            for v in free_vars(b.value):
                if id(v) not in member_ids and id(v) not in seen:
                    seen.add(id(v))
                    inputs.append(v)
        func = _make_function(bindings, inputs, outputs)
        gvar = self.add_function(func, self.group_name(bindings))
        call = Call(gvar, list(inputs), struct_info=func.ret_struct_info)
        if len(outputs) == 1:
            return [VarBinding(outputs[0], call)]
        tup_var = DataflowVar("lv", func.ret_struct_info)
        new = [VarBinding(tup_var, call)]
        for i, o in enumerate(outputs):
            new.append(VarBinding(o, TupleGetItem(tup_var, i)))
        return new

    def group_name(self, bindings) -> str:
        parts = []
        for b in bindings:
            v = b.value
            if is_call_tir(v):
                parts.append(v.args[0].name_hint)
            elif isinstance(v, Call) and isinstance(v.op, Op):
                parts.append(_short_op_name(v.op.name))
            elif isinstance(v, Call) and isinstance(v.op, GlobalVar):
                parts.append(v.op.name_hint)
        name = "fused_" + "_".join(parts) if parts else "fused"
        return name[:80]

    def add_function(self, func: Function, hint: str) -> GlobalVar:
        h = structural_hash(func)
        for name, other in self.by_hash.get(h, []):
            if structural_equal(func, other):
                return GlobalVar(name, other.struct_info)
        name, k = hint, 0
        while name in self.funcs:
            k += 1
            name = f"{hint}{k}"
        self.funcs[name] = func
        self.by_hash.setdefault(h, []).append((name, func))
        return GlobalVar(name, func.struct_info)


def _is_tensor_like(si) -> bool:
    if isinstance(si, TensorStructInfo):
        return True
    if isinstance(si, TupleStructInfo):
        return all(_is_tensor_like(f) for f in si.fields)
    return False


def _same_shape(a, b) -> bool:
    if not (isinstance(a, TensorStructInfo) and isinstance(b, TensorStructInfo)):
        return False
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    return all(structural_equal(x, y) for x, y in zip(a.shape, b.shape))


def _flat_inputs(args) -> list[Expr]:
    out = []
    for a in args:
        if isinstance(a, Tuple):
            out.extend(_flat_inputs(list(a.fields)))
        else:
            out.append(a)
    return out


def _make_function(bindings, inputs: list[Var], outputs: list[Var]) -> Function:
    """``@R.function(private=True) def fused(inputs) { with dataflow: bindings; return out }``"""
    remap: dict[int, Var] = {}
    params = []
    for v in inputs:
        p = Var(v.name_hint, v.struct_info)
        remap[id(v)] = p
        params.append(p)
    out_ids = {id(o) for o in outputs}
    new_bindings = []
    for b in bindings:
        cls = Var if id(b.var) in out_ids else DataflowVar
        nv = cls(b.var.name_hint, b.var.struct_info)
        value = _substitute_vars(b.value, remap)
        remap[id(b.var)] = nv
        if isinstance(b, MatchCast):
            new_bindings.append(MatchCast(nv, value, b.struct_info))
        else:
            new_bindings.append(VarBinding(nv, value))
    if len(outputs) == 1:
        body = remap[id(outputs[0])]
    else:
        tup = Var("gv", TupleStructInfo([o.struct_info for o in outputs]))
        new_bindings.append(VarBinding(tup, Tuple([remap[id(o)] for o in outputs])))
        body = tup
    return Function(params, SeqExpr([DataflowBlock(new_bindings)], body), body.struct_info,
                    attrs={"Primitive": 1})


def _substitute_vars(e: Expr, remap: dict[int, Var]) -> Expr:
    """Replace Relax variables in a binding value (ANF values: calls, tuples, items)."""
    if isinstance(e, Var):
        return remap.get(id(e), e)
    if isinstance(e, Call):
        args = [_substitute_vars(a, remap) for a in e.args]
        if all(a is b for a, b in zip(args, e.args)):
            return e
        if isinstance(e.op, Op):
            return Call(e.op, args, e.attrs, e.sinfo_args)
        return Call(e.op, args, e.attrs, e.sinfo_args, e.struct_info)
    if isinstance(e, Tuple):
        fields = [_substitute_vars(f, remap) for f in e.fields]
        return e if all(a is b for a, b in zip(fields, e.fields)) else Tuple(fields)
    if isinstance(e, TupleGetItem):
        t = _substitute_vars(e.tuple_value, remap)
        return e if t is e.tuple_value else TupleGetItem(t, e.index)
    return e
