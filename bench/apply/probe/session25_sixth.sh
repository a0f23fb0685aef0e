# One H200, session 25, on the session's code: held-out scripts whose host copies go through the
# thread's slots in other ways (lists and ragged ids, per-request candidate counts, a feature thread
# handing GPU tensors over without a sync, asyncio inline, autocast, a model refreshed between
# waves, a pool made before CUDA), each unhooked (groups 0) and under a fixed 2-group plan; the
# checksums must be equal (the read mark decides when the slots are written again).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/apply/ab_cases.sh
J=$OUT/heldout.jsonl
for c in ${CASES:-jag opt topk pipe aio amp ref early}; do
  [ "$SECONDS" -lt ${STOP_AT:-400} ] || break
  ab_case "$J" unhooked "${c}0"; ab_case "$J" hooked "${c}2"
done
python3 - <<'PY'
import json, os
rows = [json.loads(l) for l in open(os.environ["OUT"] + "/heldout.jsonl")]
ref = {r["script"]: r.get("checksum") for r in rows if r["label"] == "unhooked"}
for r in rows:
    h = r.get("hook") or {}
    if r["label"] == "hooked":
        print(r["script"], "q/s", ref and [x.get("qps") for x in rows if x["script"] == r["script"] and x["label"] == "unhooked"],
              "->", r.get("qps"), "checksum equal:", r.get("checksum") == ref.get(r["script"]),
              "tr", h.get("thread_replays"), "fast", h.get("pageable_fast"), "mark_waits", h.get("mark_waits"),
              "fb", [k[:40] for k in h.get("fallbacks") or []][:2])
PY
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
