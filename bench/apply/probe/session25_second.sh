# One H200, session 25: the A/B of the first call again, interleaved case by case
# (bench/apply/tree_ab.sh: both trees back to back for each case, the order alternating by round),
# and a check that the old tree's runs do run the old code (the hook's module file in the stats).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
mkdir -p out/old && tar xzf .whl/old_ce2a778.tar.gz -C out/old
pkg=$(realpath out/old).pkg
CASES="${CASES:-dlrm4 mmoe8 plain4}" timeout ${AB_T:-500} bash bench/apply/tree_ab.sh out/old ${ROUNDS:-3} > $OUT/tree_ab.txt 2>&1
# (from another folder: python -c puts the current one, the repository root, first on sys.path; a
# script's own folder is first for the runs, so PYTHONPATH's old tree is what they import)
(cd /tmp && PYTHONPATH=$pkg python3 -c "import recsys_doctor.applying._autoapply.staging as s; print('old tree:', s.__file__, hasattr(s, 'ReadMark'))")
(cd /tmp && python3 -c "import recsys_doctor.applying._autoapply.staging as s; print('new tree:', s.__file__, hasattr(s, 'ReadMark'))")
python3 - <<'PY'
import json, os
for l in open(os.environ["OUT"] + "/tree_ab.jsonl"):
    r = json.loads(l); h = r.get("hook") or {}
    print(r["label"], r["script"], r.get("qps"), r.get("p99_ms"), r.get("checksum"), "tr", h.get("thread_replays"),
          "fb", [k[:50] for k in h.get("fallbacks") or []])
PY
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
