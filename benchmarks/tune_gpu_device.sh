# (keep .tune_gpu/db.tar.gz, ignored, between calls; it is the resumable tuning database)
# device-side driver of benchmarks/tune_gpu.py (GPU machine, carry [".device"]): resumes the
# tuning database from .tune_gpu/db.tar.gz, leaves the results, the log and the database (one
# tarball, copy it back here to resume again) under $OUT. Example:
#   TARGETS="opencl webgpu" TUNE_GPU_SECONDS=240 TUNE_GPU_TRIALS=512 bash benchmarks/tune_gpu_device.sh
# Whole models (relax.tune; results in benchmarks/results/tune_gpu_models/):
#   MODE=models TARGETS="opencl" TUNE_GPU_MODELS=bert_layer_s128 bash benchmarks/tune_gpu_device.sh
# fp16 on the tensor cores (results in benchmarks/results/tune_gpu_models_fp16/):
#   MODE=models TARGETS="opencl" TUNE_GPU_FP16=1 TUNE_GPU_MODELS=bert_layer_s128 bash benchmarks/tune_gpu_device.sh
. .device/env.sh
mkdir -p $OUT/db
[ -f .tune_gpu/db.tar.gz ] && tar -xzf .tune_gpu/db.tar.gz -C $OUT/db
export TUNE_GPU_WORK_DIR=$OUT/db
touch /tmp/tune_gpu.start
RESULTS=tune_gpu
[ "$MODE" = models ] && RESULTS=tune_gpu_models
[ "$MODE" = models ] && [ "$TUNE_GPU_FP16" = 1 ] && RESULTS=tune_gpu_models_fp16
timeout ${TUNE_LIMIT:-560} python3 -m benchmarks.tune_gpu $MODE $TARGETS > $OUT/log.txt 2>&1; echo "rc=$?" >> $OUT/log.txt
# the results file this run wrote (benchmarks/results/$RESULTS/<machine>.json)
find benchmarks/results/$RESULTS -maxdepth 1 -name '*.json' -newer /tmp/tune_gpu.start -exec cp {} $OUT/ \; 2>/dev/null
tar -czf $OUT/db.tar.gz -C $OUT/db . && rm -rf $OUT/db
grep -v "^  File\|^    " $OUT/log.txt | tail -40
