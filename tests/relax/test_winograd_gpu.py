"""Winograd F(2x2, 3x3) on GPU targets (``relax.backend.gpu.winograd``, the ``GPUWinograd``
pass): which convolutions take it, the kernels the default GPU schedules give it (the input
transform a kernel of its own, the 16 GEMMs on the GEMM rule, the epilogue in the output
transform), and its results against numpy on OpenCL (PoCL in CI) and WebGPU (lavapipe in CI):
odd image sizes (a last tile half outside), padding 0 and 1, a symbolic batch at two values,
the fused bias / residual / ReLU epilogue."""
import numpy as np
import pytest

import gpu_testutil as gpu
from tilecraft import relax
from tilecraft.relax import const, gpu_schedules as gs, op
from tilecraft.relax.backend.cpu.geometry import ConvGeometry
from tilecraft.relax.backend.gpu import winograd
from tilecraft.relax.build import _run_pipeline, legalize
from tilecraft.relax.op import nn
from tilecraft.relax.transform import GPUWinograd
from tilecraft.relax.vm import VirtualMachine
from tilecraft.targets import Target
from tilecraft.tensorir.function import PrimFunc
from capabilities import gpu_device

RNG = np.random.default_rng(32)


@pytest.fixture(scope="module", params=["opencl", "webgpu"])
def gpu_dev(request):
    return gpu_device(request.param)


def _conv_ref(img, k, pad):
    n, c, h, w = img.shape
    o, _, kh, kw = k.shape
    p = np.pad(img.astype("float64"), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, w + 2 * pad - kw + 1
    out = np.zeros((n, o, oh, ow))
    for dy in range(kh):
        for dx in range(kw):
            out += np.einsum("nchw,oc->nohw", p[:, :, dy:dy + oh, dx:dx + ow],
                             k[:, :, dy, dx].astype("float64"))
    return out


def _calls(mod):
    """Names of the kernels (PrimFuncs) of ``mod``."""
    return {n for n, f in mod.functions.items() if isinstance(f, PrimFunc)}


def test_rule_which_convolutions_take_it():
    g = ConvGeometry(256, 14, 14, 256, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)
    assert winograd.winograd_applies(g)
    assert winograd.winograd_tiles(g) == (7, 7, 64)
    for other in (ConvGeometry(256, 14, 14, 256, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 1),
                  ConvGeometry(32, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
                  ConvGeometry(256, 14, 14, 256, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1),
                  ConvGeometry(256, 14, 14, 256, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),
                  ConvGeometry(512, 5, 5, 512, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
                  # 28 x 28 and up: the direct implicit GEMM is faster (measured on the H100)
                  ConvGeometry(128, 28, 28, 128, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1),
                  ConvGeometry(64, 56, 56, 64, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1)):
        assert not winograd.winograd_applies(other), other


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_pass_rewrites_only_what_pays(kind):
    """64 -> 64 channels at 14 x 14: rewritten; 32 channels, a strided or a 1x1 layer, a CPU
    target and ``enabled=False``: left alone."""
    w64 = RNG.standard_normal((64, 64, 3, 3)).astype("float32")
    w32 = RNG.standard_normal((32, 64, 3, 3)).astype("float32")
    mod = gpu.module([("x", ("n", 64, 14, 14), "float32")],
                     lambda x: [nn.conv2d(x, const(w64), padding=(1, 1)),
                                nn.conv2d(x, const(w32), padding=(1, 1)),
                                nn.conv2d(x, const(w64), strides=(2, 2), padding=(1, 1))])
    out = GPUWinograd(kind)(mod)
    text = out.script()
    assert text.count("conv2d_nchw_winograd") >= 1 and text.count("R.nn.conv2d") == 2
    assert "R.nn.conv2d" in GPUWinograd("llvm")(mod).script()
    assert "winograd" not in GPUWinograd(kind, enabled=False)(mod).script()


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_default_schedule_three_kernels_gemm_tiled(kind):
    """After the pipeline: the weight transform is folded (no kernel), the convolution with its
    bias and ReLU is one function whose input transform stays a stage of its own and whose
    GEMM gets the GEMM rule (shared tiles, register tile, the batch on blockIdx.z, two tiles
    chosen by the batch)."""
    w = RNG.standard_normal((64, 64, 3, 3)).astype("float32")
    b = RNG.standard_normal((1, 64, 1, 1)).astype("float32")
    mod = gpu.module([("x", ("n", 64, 14, 14), "float32")],
                     lambda x: [nn.relu(op.add(nn.conv2d(x, const(w), padding=(1, 1)),
                                               const(b)))])
    lowered = legalize(_run_pipeline(mod, None, Target(kind)))
    funcs = {n: f for n, f in lowered.functions.items() if isinstance(f, PrimFunc)}
    assert not any("pack_winograd_weight" in n for n in funcs), sorted(funcs)
    (func,) = funcs.values()
    g = gs.apply(func, Target(kind))
    text = g.script()
    assert "winograd_input" in text and "winograd_gemm" in text
    assert "winograd_gemm_local" in text and "_shared" in text
    assert "if n < 4" in text          # the batch-1 tile and the nominal one
    tags = {lp.thread_tag for lp in gs._loops_of(g) if lp.kind == "thread_binding"}
    assert {"blockIdx.z", "threadIdx.y"} <= tags


@pytest.mark.parametrize("shape", [(9, 7, 1), (10, 9, 0)])
def test_winograd_conv_matches_numpy(gpu_dev, shape):
    """An odd image (9 x 7: a last tile half outside in both directions) with padding 1, and a
    10 x 9 image without padding (an 8 x 7 output); bias, a residual add and ReLU fused into the
    output transform; batch 1 and 3 on one build."""
    dev, target = gpu_dev
    H, W, pad = shape
    C, O = 8, 12
    oh, ow = H + 2 * pad - 2, W + 2 * pad - 2
    w = (RNG.standard_normal((O, C, 3, 3)) * 0.3).astype("float32")
    bias = RNG.standard_normal((1, O, 1, 1)).astype("float32")

    def body(x, r):
        y = nn.conv2d(x, const(w), padding=(pad, pad))
        return [nn.relu(op.add(op.add(y, const(bias)), r))]

    def ref(x, r):
        return [np.maximum(_conv_ref(x, w, pad) + bias + r, 0)]

    mod = gpu.module([("x", ("n", C, H, W), "float32"), ("r", ("n", O, oh, ow), "float32")],
                     body)
    mod = GPUWinograd(target, min_channels=4)(mod)
    assert "conv2d_nchw_winograd" in _calls(mod)
    gpu.check(dev, target, mod,
              lambda n: [RNG.standard_normal((n, C, H, W)).astype("float32"),
                         RNG.standard_normal((n, O, oh, ow)).astype("float32")],
              ref, sizes=(1, 3), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["opencl", "webgpu"])
def test_gpu_tile_winograd_at_each_batch_tile(kind):
    """The GPU tile (``Target(kind)``, not PoCL's CPU variant: float4 fragments, the register
    prefetch) on a 64 -> 64 layer at 14 x 14 with bias and ReLU, at batches on each side of the
    batch dispatch's thresholds (1, 5, 12: the batch-1, nominal and large tiles), against
    numpy."""
    dev, _ = gpu_device(kind)
    C = O = 64
    H = 14
    w = (RNG.standard_normal((O, C, 3, 3)) * 0.1).astype("float32")
    b = RNG.standard_normal((1, O, 1, 1)).astype("float32")
    mod = gpu.module([("x", ("n", C, H, H), "float32")],
                     lambda x: [nn.relu(op.add(nn.conv2d(x, const(w), padding=(1, 1)),
                                               const(b)))])
    exe = relax.build(mod, kind)
    vm = VirtualMachine(exe, dev)
    for n in (1, 5, 12):
        x = RNG.standard_normal((n, C, H, H)).astype("float32")
        got = vm["main"](x)[0].numpy()
        np.testing.assert_allclose(got, np.maximum(_conv_ref(x, w, 1) + b, 0), rtol=1e-4,
                                   atol=1e-4, err_msg=f"n={n}")


def test_weight_transform_numpy_matches_the_kernel():
    """The numpy transform of a constant weight (what the pass folds) against the
    ``pack_winograd_weight`` kernel run by the interpreter, for an HWIO-ordered weight too."""
    from tilecraft.tensorir import te
    from tilecraft.tensorir.interpret import interpret
    w = RNG.standard_normal((3, 5, 3, 3)).astype("float32")
    for layout, arr in (("OIHW", w), ("HWIO", np.transpose(w, (2, 3, 1, 0)).copy())):
        ph = te.placeholder(arr.shape, "float32", "w")
        func = te.create_prim_func([ph, winograd.pack_winograd_weight(ph, layout)])
        out = np.zeros((16, 3, 5), "float32")
        interpret(func, arr, out)
        np.testing.assert_allclose(winograd.winograd_weight_numpy(arr, layout), out,
                                   rtol=1e-6, atol=1e-6)


def test_runtime_weight_runs_the_transform_kernel(gpu_dev):
    """A weight passed at run time (not a constant) is transformed by the
    ``pack_winograd_weight`` kernel on every call."""
    dev, target = gpu_dev
    C, O, H = 8, 8, 9
    mod = gpu.module([("x", ("n", C, H, H), "float32"), ("w", (O, C, 3, 3), "float32")],
                     lambda x, w: [nn.conv2d(x, w, padding=(1, 1))])
    mod = GPUWinograd(target, min_channels=4)(mod)
    assert "pack_winograd_weight" in _calls(mod)
    gpu.check(dev, target, mod,
              lambda n: [RNG.standard_normal((n, C, H, H)).astype("float32"),
                         RNG.standard_normal((O, C, 3, 3)).astype("float32")],
              lambda x, w: [_conv_ref(x, w, 1)], sizes=(2,), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("out_dtype", ["float32", "float16"])
def test_float16_model_takes_winograd_and_matches_numpy(out_dtype):
    """A ToMixedPrecision convolution (float16 weights; float16 data, or the float32 input read
    as it is: FoldCastIntoGEMM) takes Winograd too, on PoCL (float16 storage) and lavapipe
    (f16), within float16's rounding of numpy."""
    from tilecraft.relax.transform import FoldCastIntoGEMM
    C, O, H = 64, 64, 9
    w = (RNG.standard_normal((O, C, 3, 3)) * 0.1).astype("float32")
    mod = gpu.module([("x", ("n", C, H, H), "float32")],
                     lambda x: [nn.relu(nn.conv2d(nn.relu(x), const(w), padding=(1, 1))),
                                nn.conv2d(x, const(w), padding=(1, 1))])
    mod16 = relax.quantize(mod, "fp16", out_dtype=out_dtype)
    for kind in ("opencl", "webgpu"):
        target = kind if kind == "opencl" else "webgpu -supports-float16=1"
        rewritten = GPUWinograd(target)(FoldCastIntoGEMM()(mod16)).script()
        assert rewritten.count("conv2d_nchw_winograd") >= 2 and "R.nn.conv2d" not in rewritten
        if kind == "opencl":
            dev = gpu_device(kind)[0]
        else:
            from tilecraft import targets
            from tilecraft.targets.webgpu_backend import runtime
            gpu_device(kind)
            if "shader-f16" not in runtime.adapter_features(0):
                continue
            runtime.close_device(0)     # reopened asking for shader-f16
            dev = targets.webgpu(0)
        vm = VirtualMachine(relax.build(mod16, target), dev)
        x = RNG.standard_normal((2, C, H, H)).astype("float32")
        w16 = w.astype("float16").astype("float32")
        refs = [np.maximum(_conv_ref(np.maximum(x, 0).astype("float16"), w16, 1), 0),
                _conv_ref(x, w16, 1)]
        outs = vm["main"](x)
        for got, ref in zip(outs, refs):
            err = np.abs(got.numpy().astype("float64") - ref).max() / np.abs(ref).max()
            assert err < (2e-3 if out_dtype == "float32" else 6e-3), (kind, out_dtype, err)


def test_float16_convolutions_stay_direct_where_tensor_cores_take_them():
    w = RNG.standard_normal((64, 64, 3, 3)).astype("float32")
    mod16 = relax.quantize(gpu.module([("x", ("n", 64, 14, 14), "float32")],
                                      lambda x: [nn.conv2d(x, const(w), padding=(1, 1))]), "fp16")
    assert "conv2d_nchw_winograd" in GPUWinograd("opencl")(mod16).script()
    assert "conv2d_nchw_winograd" not in GPUWinograd("opencl -device=nvidia")(mod16).script()


def test_float16_winograd_on_tensor_cores_on_request(monkeypatch):
    """``TILECRAFT_GPU_WINOGRAD_TC=1``: float16 Winograd also where tensor cores are (for the
    GPU's A/B of the two); and ``TILECRAFT_TC_WINDOW_CONV=0`` sends the direct 3x3 convolution
    to the SIMT rules instead of the tensor-core kernel."""
    w = RNG.standard_normal((64, 64, 3, 3)).astype("float32")
    mod16 = relax.quantize(gpu.module([("x", ("n", 64, 14, 14), "float32")],
                                      lambda x: [nn.conv2d(x, const(w), padding=(1, 1))]), "fp16")
    monkeypatch.setenv("TILECRAFT_GPU_WINOGRAD_TC", "1")
    assert "conv2d_nchw_winograd" in GPUWinograd("opencl -device=nvidia")(mod16).script()
    monkeypatch.delenv("TILECRAFT_GPU_WINOGRAD_TC")
    target = Target("opencl -device=nvidia-emulated")
    for window, tensor_cores in (("1", True), ("0", False)):
        monkeypatch.setenv("TILECRAFT_TC_WINDOW_CONV", window)
        exe = relax.build(mod16, target, upper_bounds={"n": 2})
        assert ("mma" in exe.kernel_module.get_source()) == tensor_cores, window
