# One H200: the capture's SIGTERM handler (recsys_doctor/capture/term_exit.py) and the
# processes-share-gpu finding on a multi-process program:
# 1. proc_pool_serve.py (a spawn Pool its `with` block terminates) profiled; its processes' kernel
#    overlap by plain SQL (process_overlap.py) against the finding of advise --json on the same file;
# 2. it and mp_pool_serve.py (worker processes joined on their own, each with a thread pool: nothing
#    should change) through profile --apply (it failed before the change: "the trace has no
#    kernels or copies"); 3. a small trace of 2 spawn workers, the fixture a CPU test of processes-share-gpu needs.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
timeout 120 python3 -m recsys_doctor profile examples/heldout/proc_pool_serve.py --out /tmp/pp -- --procs 4 --queries 3000 > $OUT/profile.txt 2>&1
python3 bench/apply/probe/process_overlap.py /tmp/pp/trace.sqlite | tee $OUT/process_overlap.json | cut -c1-400
python3 -m recsys_doctor advise /tmp/pp/trace.sqlite --json --no-history > $OUT/advise.json 2>/dev/null
python3 -c "import json; d=json.load(open('$OUT/advise.json')); print([(f['id'], f['severity'], f['title']) for f in d['findings'] if f['id'] == 'processes-share-gpu'])"
# a small multi-process fixture for tests/data (2 spawn workers, 200 queries: a few MB gzipped)
timeout 90 python3 -m recsys_doctor profile examples/heldout/proc_pool_serve.py --out /tmp/pp2 -- --procs 2 --queries 200 > /dev/null 2>&1
gzip -9c /tmp/pp2/trace.sqlite > $OUT/procs2_pool.sqlite.gz; ls -la $OUT/procs2_pool.sqlite.gz
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
T=400 gpu_test heldout_apply tests/test_heldout_gpu.py -k "proc_pool or mp_pool" --basetemp=/tmp/bt1
find /tmp/bt1 -name "*.json" -size -400k | tar czf $OUT/bt1.tgz -T - 2>/dev/null
(cd $OUT && tar czf logs.tgz $(ls | grep -E '\.log$|\.txt$') && rm -f $(ls | grep -E '\.log$|\.txt$'); ls)
