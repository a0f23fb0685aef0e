# One H200, session 28, sixth call: the steady path trimmed (write_again in one step, called_again's
# no-argument case, the lent outputs' check without lists, one version lookup) against e7bcfb8
# (old_tree: its git archive, carried). (1) cpu_hook_path.py on this host's CPU, old and new
# alternating: the hook's Python a DLRM query (3 pageable inputs); (2) the hook's and apply's GPU
# tests; (3) hook_ab.sh: DLRM g4 and MMoE g8, old and new trees alternating, 3 rounds.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
for i in 1 2 3 4; do for t in old new; do
  if [ $t = old ]; then P=$PWD/old_tree; else P=$PWD; fi
  (cd /tmp && PYTHONPATH=$P taskset -c 2 python3 $P/bench/apply/cpu_hook_path.py --inputs 3 --pageable --queries 20000 2>&1 | tail -1 | cut -c1-60 | sed "s/^/$t /")
done; done
echo "[${SECONDS}s]"
STOP_AT=200 T=120 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
STOP_AT=260 T=60 gpu_test apply_gpu tests/test_apply_gpu.py
CASES="dlrm4 mmoe8" AB_PIN="taskset -c 0-7" bash bench/apply/hook_ab.sh old_tree 3 2>&1 | grep -v "^setup\|^NVIDIA" | cut -c1-110
python3 - <<'PY'
import json, os, collections
by = collections.defaultdict(list)
for l in open(os.environ["OUT"] + "/hook_ab.jsonl"):
    r = json.loads(l); by[(r["script"], r["label"])].append(r.get("qps"))
for k, v in sorted(by.items()): print(k, v, "mean", round(sum(v) / len(v), 1))
PY
echo "done [${SECONDS}s]"
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
