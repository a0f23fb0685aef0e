#!/usr/bin/env bash
# The hook's GPU tests, the capture tests, and the plain serving script and the MMoE ranker
# through profile --apply (each measures a batched plan); results in $OUT/hookbatch2.tgz. It
# measured a variant that kept one batch in flight a group (reverted: call 3 of
# bench/apply/results/hookbatch_h100/README.md); on the code as it is it measures that instead.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1; export SETUP_DONE=1
R=$OUT/hookbatch2; mkdir -p $R; cp $OUT/env.json $R/
for f in test_autoapply_gpu test_apply_gpu test_capture_gpu; do
  timeout 200 python3 -m pytest -q -m gpu tests/$f.py -p no:cacheprovider > $R/$f.log 2>&1; echo "$f rc=$?"
  grep -E "^FAILED|^E  " $R/$f.log | head -6; tail -1 $R/$f.log
done
OUT=$R/acc bash bench/apply/apply_acceptance.sh script 2>&1 | grep -E "rc=|WALL" | head
OUT=$R bash bench/gpu/suite_part.sh "mmoe" 2>&1 | grep -E "rc|passed|failed" | head -3
python3 - <<PY
import json, glob
for f in glob.glob("$R/acc/script/apply.json") + glob.glob("/tmp/suite/*/apply/apply.json"):
    d = json.load(open(f)); print(d["target"].split("/")[-1], "before", d["before"].get("qps"), "chosen", (d.get("chosen") or {}).get("label"))
    for c in d["candidates"]:
        if c["measured"]:
            h = (c.get("info") or {}).get("hook") or {}
            print("   ", c["label"], c["measured"].get("qps"), c["measured"].get("p99_ms"), h.get("batch_sizes"))
PY
(cd /tmp && find suite -name apply.json -print0 | tar czf $R/suite_apply.tgz --null -T -)
tar czf $OUT/hookbatch2.tgz -C $OUT hookbatch2
