# One H200: what the product says about the offline batch-scoring job (offline_scoring_serve.py,
# DataLoader with 2 workers and pin_memory, one consumer thread), whose GPU stays 4-5% busy
# and which profile --apply speeds up only 1.20x: profile with --gil-stacks (nsys osrt with
# native stacks: the gil-handoffs finding) and --host-sample (py-spy snapshots per thread), its
# trace kept; then py-spy with --idle (every thread's stack, waits included) to see where the
# consumer thread's time goes, at 2 workers and at 0.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
S=examples/heldout/offline_scoring_serve.py
timeout 240 python3 -m recsys_doctor profile $S --gil-stacks --host-sample --out /tmp/os -- --workers 2 --queries 1000 > $OUT/os_profile.txt 2>&1
tail -3 $OUT/os_profile.txt
timeout 120 python3 -m recsys_doctor advise /tmp/os/trace.sqlite --json --no-history > $OUT/os_advise.json 2>/dev/null
python3 -c "import json; d=json.load(open('$OUT/os_advise.json')); print([(f['id'], f['severity'], f['title'][:120]) for f in d['findings']])"
ls -la /tmp/os; gzip -6c /tmp/os/trace.sqlite > $OUT/os_trace.sqlite.gz; ls -la $OUT/os_trace.sqlite.gz
for w in 2 0; do
  timeout 100 py-spy record --idle --nonblocking -r 250 --format raw -o /tmp/idle_w$w.folded -- python3 $S --workers $w --queries 2000 > /tmp/idle_w$w.json 2>/tmp/idle_w$w.err
  tail -1 /tmp/idle_w$w.json
done
(cd /tmp && tar czf $OUT/idle.tgz idle_w2.folded idle_w0.folded idle_w2.json idle_w0.json)
rm -f $OUT/setup.log; ls -la $OUT
