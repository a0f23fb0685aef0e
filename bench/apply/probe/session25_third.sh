# One H200, session 25: (1) the hook's steady path on the host alone (bench/apply/cpu_hook_path.py:
# one thread, no CUDA call, the thread graph built by hand), the old tree and the new alternating,
# DLRM's query (3 numpy arrays by torch.from_numpy(a).cuda()) and the plain script's (28 pinned
# tensors); (2) the tree A/B of the DLRM and MMoE scripts again, every run on the same 8 cores
# (taskset), 4 rounds.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
mkdir -p out/old && tar xzf .whl/old_ce2a778.tar.gz -C out/old
pkg=$(realpath out/old).pkg
rm -rf "$pkg" && mkdir -p "$pkg" && cp -r out/old/recsys_doctor "$pkg/" && for d in analyzers runtime reports; do cp -r out/old/$d "$pkg/recsys_doctor/$d"; done
for r in 1 2 3 4; do
  order="new old"; [ $((r % 2)) -eq 0 ] && order="old new"
  for t in $order; do
    pp=""; [ $t = old ] && pp=$pkg
    for a in "--inputs 3 --pageable" "--inputs 28"; do
      echo "$t $a: $(cd bench/apply && PYTHONPATH=$pp taskset -c 2 python3 cpu_hook_path.py $a --queries 20000 2>&1 | tail -1)"
    done
  done
done | tee $OUT/cpu_path.txt
CASES="${CASES:-dlrm4 mmoe8}" AB_PIN="taskset -c 0-7" timeout ${AB_T:-420} bash bench/apply/tree_ab.sh out/old ${ROUNDS:-4} > $OUT/tree_ab.txt 2>&1
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/tree_ab.jsonl"):
    r = json.loads(l); h = r.get("hook") or {}
    print(r["label"], r["script"], r.get("qps"), r.get("p99_ms"), r.get("checksum"), "tr", h.get("thread_replays"),
          "fb", [k[:50] for k in h.get("fallbacks") or []])
PY
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
