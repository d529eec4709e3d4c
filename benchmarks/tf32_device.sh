# Device-side driver of the 3xTF32 float32 GEMM (relax.backend.gpu.tensor_core_tf32) on the GPU
# machine (run tool, carry [".device"]): 200-420 s (each part has its own limit). Everything
# lands under $OUT.
#
#   bash benchmarks/tf32_device.sh
#
# 1. the 3xTF32 tests on NVIDIA's driver (inline PTX cvt.rna.tf32 / mma.sync m16n8k8), -x;
# 2. benchmarks/gpu_tf32.py: BERT's dense layers (M 128 and 2048; 768x768, 768x3072,
#    3072x768) and a ResNet-50 3x3 convolution: our SIMT fp32, 3xTF32, torch fp32 (TF32 off),
#    ms and max relative error against float64 (plain TF32's error beside);
# 3. benchmarks/gpu_models on MODELS (default bert_base_s128,resnet50) with the option on, PyTorch
#    beside; BASELINE=1 adds the plain "opencl" target in the same run (twice the build time).
# TEST_LIMIT / BENCH_LIMIT / MODEL_LIMIT: seconds for each part (0 skips it). Kernel knobs
# pass through: TILECRAFT_TF32_MIN_OUTPUTS=n (SIMT below n outputs; default 2^19, 0: never),
# TILECRAFT_TF32_SMALL_ACC=1 (the small terms in accumulators of their own),
# TILECRAFT_GPU_WINOGRAD=0 (ResNet's 3x3 stride-1 layers as 3xTF32 implicit GEMMs instead of
# SIMT Winograd), TILECRAFT_TC_TILE=BMxBNxWMxWN.
. .device/env.sh
nvidia-smi -L | tee $OUT/card.txt
latest() { ls -t "$1"/*.json | head -1; }
TF32="opencl -device=nvidia -fp32-tensor-cores=3xtf32"
if [ "${TEST_LIMIT:-150}" != 0 ]; then
  TILECRAFT_TC_DEVICE=nvidia timeout ${TEST_LIMIT:-150} \
    python3 -m pytest -q -x -rP -p no:cacheprovider \
    tests/targets/test_opencl_tensor_core_tf32.py tests/relax/test_tensor_core_tf32_gpu.py \
    > $OUT/tf32_tests.log 2>&1
fi
if [ "${BENCH_LIMIT:-90}" != 0 ]; then
  timeout ${BENCH_LIMIT:-90} python3 -m benchmarks.gpu_tf32 > $OUT/tf32_bench.log 2>&1
  cp "$(latest benchmarks/results/gpu_tf32)" $OUT/gpu_tf32.json 2>/dev/null
fi
if [ "${MODEL_LIMIT:-180}" != 0 ]; then
  targets="$TF32"
  [ "${BASELINE:-0}" != 0 ] && targets="opencl,$TF32"
  TILECRAFT_GPU_MODELS=${MODELS:-bert_base_s128,resnet50} TILECRAFT_GPU_MODEL_TARGETS="$targets" \
    TILECRAFT_GPU_MODEL_BATCHES=${BATCHES:-1,16} \
    timeout ${MODEL_LIMIT:-180} python3 -m benchmarks.gpu_models > $OUT/tf32_models.log 2>&1
  cp "$(latest benchmarks/results/gpu_models)" $OUT/gpu_models_tf32.json 2>/dev/null
fi
grep -h "^K=\|FAILED\|Error" $OUT/tf32_tests.log 2>/dev/null | cut -c1-300 | head -20
tail -3 $OUT/tf32_tests.log 2>/dev/null
tail -16 $OUT/tf32_bench.log 2>/dev/null
grep -h "ratio\|Error" $OUT/tf32_models.log 2>/dev/null | tail -12
