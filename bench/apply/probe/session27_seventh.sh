# One H200, session 27, seventh call: busy_probe.py on the code before the fix (revert_mark_fix.py
# all) and on the fixed code: which stream each mark is made on and what it counted at its capture.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
cp -r recsys_doctor/applying/_autoapply /tmp/aa_backup
python3 bench/apply/probe/revert_mark_fix.py all && timeout 60 python3 bench/apply/probe/busy_probe.py 2>&1 | grep -v Warning | tail -12
cp /tmp/aa_backup/*.py recsys_doctor/applying/_autoapply/
echo "-- fixed"; timeout 60 python3 bench/apply/probe/busy_probe.py 2>&1 | grep -v Warning | tail -12
echo "done [${SECONDS}s]"
