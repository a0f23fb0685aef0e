# One H200, session 27, seventh call (NOT RUN: no device time was left): busy_probe.py on the code
# before the fix (revert_mark_fix.py all) and on the fixed code, with CUDA_DEVICE_MAX_CONNECTIONS
# 8 (the default) and 32. The busy-stream test passed on the old code in calls 4-6; the likeliest
# reason: with few hardware queues the capture's side stream shared one with the group stream, so the
# eager run queued behind the zeroing anyway (calls 5 and 6 ran with the default 8; the failures of
# calls 1 and 2 came in some iterations only, as the streams each activation makes map anew).
# Which stream each mark is made on and what it counted at its capture are printed.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
cp -r recsys_doctor/applying/_autoapply /tmp/aa_backup
python3 bench/apply/probe/revert_mark_fix.py all
for c in 8 32; do
  echo "-- old code, CUDA_DEVICE_MAX_CONNECTIONS=$c"
  CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 60 python3 bench/apply/probe/busy_probe.py 2>&1 | grep -v Warning | tail -8
done
cp /tmp/aa_backup/*.py recsys_doctor/applying/_autoapply/
echo "-- fixed, CUDA_DEVICE_MAX_CONNECTIONS=32"
CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 60 python3 bench/apply/probe/busy_probe.py 2>&1 | grep -v Warning | tail -8
echo "done [${SECONDS}s]"
