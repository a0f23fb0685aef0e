# One H200, session 28, first call: (1) the hook's and apply's GPU tests on the code as committed
# (the DLPack / __cuda_array_interface__ checks of lent outputs had CPU tests only); (2) busy_probe.py
# on the code before the read-mark fix with CUDA_DEVICE_MAX_CONNECTIONS 8 and 32, and on the fixed
# code with 32 (why the forced-order test passed on the old code, session 27); (3) py-spy --gil of
# the hooked DLRM (g4, outputs lent) and unhooked, and of the hand-written graph server, same
# arguments, to see where the hooked run's extra GIL time per query goes.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
STOP_AT=200 T=120 gpu_test autoapply_gpu tests/test_autoapply_gpu.py
STOP_AT=260 T=60 gpu_test apply_gpu tests/test_apply_gpu.py
cp -r recsys_doctor/applying/_autoapply /tmp/aa_backup
python3 bench/apply/probe/revert_mark_fix.py all
for c in 8 32; do
  echo "-- old code, CUDA_DEVICE_MAX_CONNECTIONS=$c"
  CUDA_DEVICE_MAX_CONNECTIONS=$c timeout 45 python3 bench/apply/probe/busy_probe.py 2>&1 | grep -v Warning | tail -8 | cut -c1-220
done
cp /tmp/aa_backup/*.py recsys_doctor/applying/_autoapply/
git diff --stat -- recsys_doctor | tail -1
echo "-- fixed, CUDA_DEVICE_MAX_CONNECTIONS=32"
CUDA_DEVICE_MAX_CONNECTIONS=32 timeout 45 python3 bench/apply/probe/busy_probe.py 2>&1 | grep -v Warning | tail -8 | cut -c1-220
echo "[${SECONDS}s]"
export CUDA_DEVICE_MAX_CONNECTIONS=32
S=examples/scripts
RD_GROUPS=4 timeout 150 python3 bench/apply/gil_profile.py $OUT/gp_dlrm $S/dlrm_numpy_serve.py --threads 4 --queries 8000 > $OUT/gp_dlrm.txt 2>&1
grep -E "^(unhooked|hooked):" $OUT/gp_dlrm.txt | cut -c1-200
mkdir -p $OUT/gp_hand
timeout 90 py-spy record --gil --nonblocking -r 200 --format raw -o $OUT/gp_hand/unhooked.folded -- \
  python3 bench/apply/handwritten/dlrm_graph_serve.py --threads 4 --queries 8000 > $OUT/gp_hand/unhooked.json 2> $OUT/gp_hand/unhooked.stderr
tail -n 1 $OUT/gp_hand/unhooked.json | cut -c1-200
cp $OUT/gp_hand/unhooked.folded $OUT/gp_hand/hooked.folded; cp $OUT/gp_hand/unhooked.json $OUT/gp_hand/hooked.json
python3 bench/apply/gil_share.py $OUT/gp_dlrm "client (dlrm_numpy_serve.py" --by-frame 2>&1 | head -20 | cut -c1-220
python3 bench/apply/gil_share.py $OUT/gp_hand "client (dlrm_graph_serve.py" 2>&1 | head -3 | cut -c1-220
python3 - <<'PY'
import sys; sys.path.insert(0, "bench/apply")
from pathlib import Path
from gil_profile import top
import os
o = Path(os.environ["OUT"])
for f in (o / "gp_dlrm/hooked.folded", o / "gp_hand/unhooked.folded"):
    if f.is_file(): print("\n".join(top(f, 18)))
PY
rm -f $OUT/gp_hand/hooked.*
for f in $OUT/gp_*/*.folded; do gzip -f "$f"; done
echo "done [${SECONDS}s]"
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
