#!/usr/bin/env bash
# The hook's GPU tests (batching, host arguments copied inside forward) and the plain serving
# script through profile --apply (which now measures a batched candidate too), on the GPU
# machine (carry .whl and .gpu-libs); results in $OUT/hookbatch.tgz.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
R=$OUT/hookbatch; mkdir -p $R; cp $OUT/env.json $R/
for f in test_autoapply_gpu test_apply_gpu; do
  timeout 240 python3 -m pytest -q -m gpu tests/$f.py -p no:cacheprovider > $R/$f.log 2>&1; echo "$f rc=$?"
  grep -E "^FAILED|^E  " $R/$f.log | head -8; tail -1 $R/$f.log
done
OUT=$R/acc bash bench/apply/apply_acceptance.sh script 2>&1 | grep -E "rc=|WALL|queries/s|chosen|batched|declined" | head -20
tar czf $OUT/hookbatch.tgz -C $OUT hookbatch
