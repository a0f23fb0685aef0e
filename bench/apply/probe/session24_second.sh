# One H200: graph-candidate's step between host syncs on real PyTorch programs whose queries repeat
# a block inside (a hand-written decode loop: 8 identical decode steps a request; a Transformer's
# identical layers): each through `recsys-doctor profile` (nsys), its trace and advise JSON back.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
for s in generative_decode_serve seqrec_serve; do
  rm -rf /tmp/p_$s
  timeout 200 recsys-doctor profile examples/heldout/$s.py --out /tmp/p_$s -- --threads 4 --queries 400 \
    > $OUT/$s.profile.txt 2>&1
  echo "$s rc=$? [${SECONDS}s]"; tail -1 /tmp/p_$s/program.log
  recsys-doctor advise /tmp/p_$s/trace.sqlite --json --no-history > $OUT/$s.advise.json 2>/dev/null
  gzip -c /tmp/p_$s/trace.sqlite > $OUT/$s.sqlite.gz; ls -la $OUT/$s.sqlite.gz
done
