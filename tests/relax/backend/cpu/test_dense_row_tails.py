"""Dense layers on a symbolic row count: every row tile runs exactly its rows
(``default_schedules.split_row_tails``), the accumulators stay one tile, and the results match
numpy at every row count around the tile height."""
import re

import numpy as np

from tilecraft import relax, targets
from tilecraft.relax import BlockBuilder, TensorStructInfo, Var, const, op
from tilecraft.relax import default_schedules as ds
from tilecraft.relax.transform import get_pipeline
from tilecraft.targets import Target
from tilecraft.tensorir.transform import lower

RNG = np.random.default_rng(30)
AVX512 = Target("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512")


def dense_module(k: int, n_out: int):
    w = RNG.standard_normal((k, n_out)).astype("float32")
    b = RNG.standard_normal(n_out).astype("float32")
    bb = BlockBuilder()
    x = Var("x", TensorStructInfo(("n", k), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(op.add(bb.emit(op.matmul(x, const(w))), const(b)))
            gv = bb.emit_output(bb.emit(op.nn.relu(y)))
        bb.emit_func_output(gv)
    return bb.get(), w, b


def test_dense_symbolic_rows_exact_tiles():
    mod, _, _ = dense_module(40, 96)
    lowered = get_pipeline(target=AVX512)(mod)
    dense = [f for gv, f in lowered.functions.items() if "dense" in str(gv)]
    assert dense
    g = ds.apply(dense[0], AVX512)
    text = g.script()
    # a whole tile of 6 rows, and tails of 1 to 5, none with a row test
    assert ">= 6:" in text and all(f"== {r}:" in text for r in range(1, 5))
    assert f"if n <= {ds.GEMV_MAX_ROWS}" not in text
    assert not re.search(r"T\.where\([^)]*< n\)", text)
    # the accumulators are one tile (6 rows x the panel width), not (n, N)
    allocs = re.findall(r'_local = T.allocate\(\(([^)]*)\),', lower(g).script())
    assert allocs and all(a.rstrip(",").isdigit() for a in allocs), allocs


def test_dense_symbolic_rows_match_numpy():
    mod, w, b = dense_module(40, 96)
    exe = relax.build(mod, "llvm", upper_bounds={"n": 16})
    vm = relax.VirtualMachine(exe, targets.cpu(0))
    for rows in (1, 2, 3, 5, 6, 7, 8, 11, 12, 13):
        x = RNG.standard_normal((rows, 40)).astype("float32")
        np.testing.assert_allclose(vm["main"](x).numpy(), np.maximum(x @ w + b, 0),
                                   rtol=1e-4, atol=1e-4)
