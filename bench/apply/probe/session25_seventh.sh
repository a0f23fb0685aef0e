# One H200, session 25, on the session's code: where DLRM's hooked GIL time goes now (py-spy --gil,
# 4 threads, g4), split as in session23_h200/3_gil/ (391 us a query under py-spy then, the hook's
# own 181 us), for the next change to the hook's steady path.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
S=examples/scripts
RD_GROUPS=4 timeout 200 python3 bench/apply/gil_profile.py /tmp/gp_dlrm $S/dlrm_numpy_serve.py --threads 4 --queries 8000 > /tmp/gp_dlrm.txt 2>&1
head -4 /tmp/gp_dlrm.txt | cut -c1-200
python3 bench/apply/gil_share.py /tmp/gp_dlrm "client (dlrm_numpy_serve.py" --by-frame 2>&1 | head -40 | cut -c1-200
(cd /tmp && tar czf $OUT/gp.tgz gp_dlrm gp_dlrm.txt)
rm -f $OUT/setup.log; ls $OUT
