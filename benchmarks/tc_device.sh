# Device-side driver of the tensor-core fp16 GEMM's variants (GPU machine, carry [".device"]),
# about 240 s: (1) its tests with the inline PTX on NVIDIA's driver — the intrinsics and every
# TensorCoreOptions once, then the kernel tests under each variant; (2) the BERT dense layers
# under each variant beside our fp32 and torch fp16 addmm (benchmarks.gpu_tensor_core's
# TILECRAFT_TC_VARIANTS table, correctness per variant); (3) the BERT layer's fp16 rows with
# and without tensor cores (benchmarks.lowp_fp16), under the variant of least total time in (2).
# Everything lands under $OUT: tc_*.log, gpu_tensor_core.json, lowp_fp16.json.
#
# On the device (run tool, carry [".device"]):
#   bash benchmarks/tc_device.sh
# VARIANTS: TILECRAFT_TC_VARIANTS of (2); TEST_VARIANTS: the variants (1) runs the kernel tests
# under; TEST_LIMIT (each test run), BENCH_LIMIT, BERT_LIMIT: seconds (0 skips the part).
. .device/env.sh
nvidia-smi -L | tee $OUT/card.txt
VARIANTS=${VARIANTS:-base,ldm,ldm_async2,ldm_async3,async2,split,all,all3,all:128x128x64x64,all:64x64x32x32}
TEST_VARIANTS=${TEST_VARIANTS:-all ldm all3}
latest() { ls -t "$1"/*.json 2>/dev/null | head -1; }
PYTEST="python3 -m pytest -q -x -p no:cacheprovider"
if [ "${TEST_LIMIT:-25}" != 0 ]; then
  # the intrinsics alone and every (ldmatrix, stages) on both weight layouts
  TILECRAFT_TC_DEVICE=nvidia timeout ${TEST_LIMIT:-25} $PYTEST tests/targets/test_opencl_tensor_core.py \
    tests/relax/test_tensor_core_gpu.py -k "ldmatrix or cp_async or mma or pack or fragment_loads" \
    > $OUT/tc_tests_options.log 2>&1
  echo "options: $(tail -1 $OUT/tc_tests_options.log)"
  for v in $TEST_VARIANTS; do
    ( eval "$(python3 -m benchmarks.gpu_tensor_core --env $v)"
      TILECRAFT_TC_DEVICE=nvidia timeout ${TEST_LIMIT:-25} $PYTEST tests/relax/test_tensor_core_gpu.py \
        -k "not fragment_loads" > $OUT/tc_tests_$v.log 2>&1 )
    echo "$v: $(tail -1 $OUT/tc_tests_$v.log)"
  done
fi
if [ "${BENCH_LIMIT:-70}" != 0 ]; then
  TILECRAFT_TC_VARIANTS=$VARIANTS timeout ${BENCH_LIMIT:-70} python3 -m benchmarks.gpu_tensor_core \
    > $OUT/tc_bench.log 2>&1
  cp "$(latest benchmarks/results/gpu_tensor_core)" $OUT/gpu_tensor_core.json 2>/dev/null
  tail -22 $OUT/tc_bench.log
fi
BEST=$(grep -h "^best variant: " $OUT/tc_bench.log 2>/dev/null | tail -1 | cut -d' ' -f3)
if [ "${BERT_LIMIT:-80}" != 0 ]; then
  # the BERT layer under the best variant (its tile, if it names one, is dropped: the layer's
  # GEMMs have other shapes than one forced tile suits), else the defaults
  ( if [ -n "$BEST" ] && [ "$BEST" != None ]; then
      eval "$(python3 -m benchmarks.gpu_tensor_core --env ${BEST%%:*})"; fi
    echo "BERT layer with variant ${BEST%%:*} ($(env | grep TILECRAFT_TC_ | tr '\n' ' '))"
    TILECRAFT_LOWP_TARGETS=opencl-tc,opencl TILECRAFT_LOWP_MODELS=bert_layer_s128 \
      timeout ${BERT_LIMIT:-80} python3 -m benchmarks.lowp_fp16 ) > $OUT/tc_bert.log 2>&1
  cp "$(latest benchmarks/results/lowp_fp16)" $OUT/lowp_fp16.json 2>/dev/null
  head -1 $OUT/tc_bert.log
  grep -h "speedup\|Error" $OUT/tc_bert.log | tail -8
fi
