# One H200, session 29, second call: lent outputs read back with .cpu() from the thread graph's own
# copy to pinned host memory (_autoapply/hostread.py). (1) the new GPU test alone, then the hook's GPU
# tests whole; (2) knob_ab.sh: DLRM g4 and the plain script g4, host reads on ("-") and off
# (RECSYS_DOCTOR_HOST_READS=0), back to back, 3 rounds, order alternating; checksums and host_reads.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
T=90 gpu_test hostread_gpu tests/test_autoapply_gpu.py -k read_back
grep -E "Error|error|assert" $OUT/hostread_gpu.log | head -20
STOP_AT=120 T=100 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
CASES="dlrm4 plain4" KNOBS="- RECSYS_DOCTOR_HOST_READS=0" AB_PIN="taskset -c 0-7" timeout $((540 - SECONDS)) bash bench/apply/knob_ab.sh 3 2>&1 | grep -v "^setup\|^NVIDIA" | cut -c1-110
python3 - <<'PY'
import json, os, collections
by = collections.defaultdict(list)
for l in open(os.environ["OUT"] + "/knob_ab.jsonl"):
    r = json.loads(l); h = r.get("hook") or {}
    by[(r["script"], r["label"])].append((r.get("qps"), r.get("checksum"), h.get("host_reads"), h.get("thread_graphs")))
for k, v in sorted(by.items()):
    q = [x[0] for x in v if x[0]]
    print(k, "mean", round(sum(q) / max(1, len(q)), 1), v)
PY
echo "done [${SECONDS}s]"
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
