# Device-side driver of the GPU low-precision rows (GPU machine, carry [".device"], as
# benchmarks/gpu_models_device.sh): the int4 GEMV rows of benchmarks/lowp.py, then the fp16 rows
# of benchmarks/lowp_fp16.py (WebGPU f16 first: never measured on the device), then the
# low-precision GPU tests through NVIDIA's drivers. Everything lands under $OUT.
#
# On the device (run tool, carry [".device"]):
#   bash benchmarks/lowp_device.sh
# INT4_LIMIT / FP16_LIMIT / TEST_LIMIT / TC_LIMIT: seconds for each part (0 skips it);
# FP16_MODELS: TILECRAFT_LOWP_MODELS (default resnet50,bert_layer_s128: the models);
# FP16_TARGETS: TILECRAFT_LOWP_TARGETS (default webgpu,opencl,opencl-tc,opencl-half).
# The tensor-core part alone (tests on the real driver, the BERT dense layers beside our fp32
# and torch fp16 addmm, the BERT layer's fp16 rows with and without tensor cores):
#   INT4_LIMIT=0 TEST_LIMIT=0 FP16_MODELS=bert_layer_s128 FP16_TARGETS=opencl,opencl-tc \
#     bash benchmarks/lowp_device.sh
# The fp16 rows time fp32, fp16 with float32 accumulation and (webgpu, opencl-half) fp16 with
# float16 accumulation; TILECRAFT_GEMM_HALF_SHARED=float16 in the environment runs the float16
# shared-tile variant of the float32-accumulating GEMMs (it replaces the same rows: keep the
# first file).
. .device/env.sh
nvidia-smi -L | tee $OUT/card.txt
latest() { ls -t "$1"/*.json | head -1; }
if [ "${INT4_LIMIT:-150}" != 0 ]; then
  # the layer rows first: a stop in the whole-model row keeps them in the log
  timeout ${INT4_LIMIT:-150} python3 -m benchmarks.lowp --rows int4-gpu-layers,int4-gpu \
    > $OUT/int4.log 2>&1
  cp "$(latest benchmarks/results/lowp)" $OUT/lowp.json 2>/dev/null
fi
if [ "${TC_LIMIT:-240}" != 0 ]; then
  # the tensor-core GEMM: its tests with the inline PTX on the real driver, then its timings
  TILECRAFT_TC_DEVICE=nvidia timeout ${TC_LIMIT:-240} python3 -m pytest -q -p no:cacheprovider \
    tests/targets/test_opencl_tensor_core.py tests/relax/test_tensor_core_gpu.py > $OUT/tc_tests.log 2>&1
  timeout ${TC_LIMIT:-240} python3 -m benchmarks.gpu_tensor_core > $OUT/tc_bench.log 2>&1
  cp "$(latest benchmarks/results/gpu_tensor_core)" $OUT/gpu_tensor_core.json 2>/dev/null
fi
if [ "${FP16_LIMIT:-300}" != 0 ]; then
  # written after each (model, target): a stop keeps the rows measured
  TILECRAFT_LOWP_TARGETS=${FP16_TARGETS:-webgpu,opencl,opencl-tc,opencl-half} \
  TILECRAFT_LOWP_MODELS=${FP16_MODELS:-resnet50,bert_layer_s128} \
    timeout ${FP16_LIMIT:-300} python3 -m benchmarks.lowp_fp16 > $OUT/fp16.log 2>&1
  cp "$(latest benchmarks/results/lowp_fp16)" $OUT/lowp_fp16.json 2>/dev/null
fi
if [ "${TEST_LIMIT:-120}" != 0 ]; then
  timeout ${TEST_LIMIT:-120} python3 -m pytest -q -p no:cacheprovider \
    tests/relax/test_dense_q4_gpu.py tests/relax/test_fp16_gpu_gemm.py > $OUT/tests.log 2>&1
fi
grep -h "int4-g128\|Error" $OUT/int4.log 2>/dev/null | tail -20
grep -h "speedup\|Error" $OUT/fp16.log 2>/dev/null | tail -20
tail -5 $OUT/tests.log 2>/dev/null
tail -3 $OUT/tc_tests.log 2>/dev/null
tail -12 $OUT/tc_bench.log 2>/dev/null
