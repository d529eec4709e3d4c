# Device-side driver of benchmarks/gpu_models.py (GPU machine, carry [".device"]): the models on
# a base tree and on this checkout, one after the other on the same card, each beside its own
# PyTorch eager baseline; then the launch overhead and the GPU test files through NVIDIA's
# drivers. Everything lands under $OUT (logs and the results files).
#
# Here, before the call (the base: the commit to compare against, e.g. main):
#   rm -rf .device/base_tree && mkdir -p .device/base_tree && git archive main | tar -x -C .device/base_tree
# Then, on the device (run tool, carry [".device"]):
#   MODELS=resnet50,bert_layer_s128 bash benchmarks/gpu_models_device.sh
# MODELS: TILECRAFT_GPU_MODELS for this checkout (default: all five; ~8 min of builds and runs
# on an H200 with two targets; three now: opencl, webgpu, webgpu-adapter, unless
# TILECRAFT_GPU_MODEL_TARGETS says otherwise); BASE_LIMIT / MINE_LIMIT / ATTN_LIMIT / TEST_LIMIT: seconds for each part.
. .device/env.sh
nvidia-smi -L | tee $OUT/card.txt
SITE=$(pwd)/.device/site
export TILECRAFT_GPU_MODEL_BATCHES=${TILECRAFT_GPU_MODEL_BATCHES:-1,16}
latest() { ls -t "$1"/*.json | head -1; }
if [ -d .device/base_tree ]; then
  (cd .device/base_tree && PYTHONPATH=$SITE:$(pwd) timeout ${BASE_LIMIT:-150} \
     python3 -m benchmarks.gpu_models > $OUT/base.log 2>&1
   cp "$(latest benchmarks/results/gpu_models)" $OUT/base_models.json)
fi
TILECRAFT_GPU_MODELS=${MODELS:-resnet50,mobilenet_v2,bert_layer_s128,bert_base_s128,gpt2_small_s128} \
  timeout ${MINE_LIMIT:-300} python3 -m benchmarks.gpu_models > $OUT/models.log 2>&1
cp "$(latest benchmarks/results/gpu_models)" $OUT/models.json
# the fused attention beside the unfused kernels and PyTorch (BERT-base shapes; ATTN_LIMIT=0 skips)
if [ "${ATTN_LIMIT:-120}" != 0 ]; then
  timeout ${ATTN_LIMIT:-120} python3 -m benchmarks.gpu_attention > $OUT/attention.log 2>&1
  cp "$(latest benchmarks/results/gpu_attention)" $OUT/attention.json 2>/dev/null
fi
# ResNet-50's convolutions alone, direct and Winograd, beside F.conv2d (CONV_LIMIT=0 skips)
if [ "${CONV_LIMIT:-70}" != 0 ]; then
  timeout ${CONV_LIMIT:-70} python3 -m benchmarks.gpu_convs > $OUT/convs.log 2>&1
  cp "$(latest benchmarks/results/gpu_convs)" $OUT/convs.json 2>/dev/null
fi
# WebGPU with the spec's vs the adapter's limits, k-step 16, naga's checks, beside OpenCL and
# torch (GEMM 2048x768x3072, a ResNet 3x3 conv; PROBE_LIMIT=0 skips)
if [ "${PROBE_LIMIT:-90}" != 0 ]; then
  timeout ${PROBE_LIMIT:-90} python3 -m benchmarks.gpu_webgpu probe > $OUT/webgpu_probe.log 2>&1
  cp "$(latest benchmarks/results/gpu_webgpu_limits)" $OUT/webgpu_probe.json 2>/dev/null
fi
timeout 40 python3 -m benchmarks.gpu_launch_overhead > $OUT/launch.log 2>&1
cp "$(latest benchmarks/results/gpu_launch_overhead)" $OUT/launch.json
timeout ${TEST_LIMIT:-90} python3 -m pytest -q -p no:cacheprovider tests/targets/test_opencl_runtime.py \
  tests/targets/test_webgpu_runtime.py tests/targets/test_webgpu_adapter_target.py tests/targets/test_gpu_launch_path.py \
  tests/relax/test_default_schedules_gpu.py tests/targets/test_gpu_vector_codegen.py \
  tests/relax/test_relax_gpu_kernel_errors.py tests/relax/test_fused_attention_gpu.py \
  tests/relax/test_winograd_gpu.py > $OUT/tests.log 2>&1
grep -h "ratio\|Error" $OUT/base.log $OUT/models.log $OUT/attention.log $OUT/convs.log 2>/dev/null; tail -14 $OUT/webgpu_probe.log 2>/dev/null; tail -22 $OUT/launch.log; tail -5 $OUT/tests.log
