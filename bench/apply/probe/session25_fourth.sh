# One H200, session 25, on the session's code: the hook's GPU tests (the new one: copies made while
# the thread's last replay still runs wait for its read mark), then issue 25's suite rows of the
# DLRM and MMoE scripts through `profile --apply` (bench/gpu/suite_part.sh).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
T=200 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
STOP_AT=${STOP_AT:-260} T=120 gpu_test pipeline_gpu tests/test_autoapply_pipeline_gpu.py
[ "$SECONDS" -lt 300 ] && timeout 280 bash bench/gpu/suite_part.sh "${SUITE:-dlrm or mmoe}"
python3 - <<'PY'
import json, os
p = os.environ["OUT"] + "/scripts_suite.json"
if os.path.exists(p):
    for r in json.load(open(p)):
        print(r["script"], r.get("speedup"), r.get("chosen"), r.get("before", {}).get("qps"), r.get("after", {}).get("qps"),
              r.get("outputs_equal"), r.get("syncs_per_unit"), r.get("gpu_busy_pct"))
PY
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
