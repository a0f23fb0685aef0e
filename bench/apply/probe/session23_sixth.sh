# One H200: does what gil-handoffs now asks for the batch-scoring job hold? offline_scoring_serve.py
# as it is (pin_memory=True) against the same with every DataLoader's pin_memory forced off
# (nopin_run.py), at 2 workers and at 0, three rounds, the order alternating; each row its JSON line.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
S=examples/heldout/offline_scoring_serve.py
for r in 1 2 3; do
  for w in 2 0; do
    if [ $((r % 2)) -eq 1 ]; then order="pin nopin"; else order="nopin pin"; fi
    for m in $order; do
      if [ $m = pin ]; then line=$(timeout 100 python3 $S --workers $w --queries 2000 2>/dev/null | tail -1)
      else line=$(timeout 100 python3 bench/apply/probe/nopin_run.py $S --workers $w --queries 2000 2>/dev/null | tail -1); fi
      echo "{\"round\": $r, \"mode\": \"$m\", \"run\": $line}" | tee -a $OUT/nopin.jsonl | cut -c1-200
    done
  done
done
rm -f $OUT/setup.log; ls $OUT
