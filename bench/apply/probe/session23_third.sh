# One H200: where the hook's own GIL time goes on the scripts that reach 4-5x of issue 25's 8x (DLRM
# numpy, 4 threads) and on candidates (thread graphs that replay): py-spy --gil unhooked and under g4
# (bench/apply/gil_profile.py), split by gil_share.py --by-frame as for kjt in session21_h200/3_gil/.
# The hook's steady per-query work by frame is what a next change to the model-call path must cut.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
S=examples/scripts
RD_GROUPS=4 timeout 200 python3 bench/apply/gil_profile.py /tmp/gp_dlrm $S/dlrm_numpy_serve.py --threads 4 --queries 8000 > /tmp/gp_dlrm.txt 2>&1
head -4 /tmp/gp_dlrm.txt | cut -c1-200
RD_GROUPS=4 timeout 200 python3 bench/apply/gil_profile.py /tmp/gp_cand $S/candidates_ranker.py --threads 4 --queries 4000 > /tmp/gp_cand.txt 2>&1
head -4 /tmp/gp_cand.txt | cut -c1-200
python3 bench/apply/gil_share.py /tmp/gp_dlrm "client (dlrm_numpy_serve.py" --by-frame 2>&1 | head -40 | cut -c1-200
python3 bench/apply/gil_share.py /tmp/gp_cand "handle (candidates_ranker.py" --by-frame 2>&1 | head -40 | cut -c1-200
(cd /tmp && tar czf $OUT/gp.tgz gp_dlrm gp_cand gp_dlrm.txt gp_cand.txt)
rm -f $OUT/setup.log; ls $OUT
