# One H200, session 28, seventh call: issue 25's suite rows of DLRM and MMoE through `profile
# --apply` (bench/gpu/suite_part.sh "dlrm or mmoe") on the hook as committed (lent outputs, the
# trimmed steady path); the H200 rows before were session 25's, before lending.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
timeout 400 bash bench/gpu/suite_part.sh "dlrm or mmoe"
python3 - <<'PY'
import json, os
p = os.environ["OUT"] + "/scripts_suite.json"
for r in json.load(open(p)) if os.path.exists(p) else []:
    print(r["script"], r["speedup"], r["before"]["qps"], "->", r["after"]["qps"], r["chosen"], "equal", r["outputs_equal"],
          "syncs", r.get("syncs_per_unit"), "busy", r.get("gpu_busy_pct"))
PY
echo "done [${SECONDS}s]"
