# One H200, session 27, second call: mark_race.py again, now logging each thread graph's read mark
# (its counter's device and host values against base + replays after every iteration, and the value
# seen before each replay), where its counter was made, and when each capture ran; lending off
# (the first call found the fault with lending on and off alike).
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
for i in 1 2 3 4; do
  [ "$SECONDS" -lt 200 ] || break
  RECSYS_DOCTOR_LEND_OUTPUTS=0 timeout 60 python3 bench/apply/probe/mark_race.py --iters 8 > $OUT/mark_race_$i.txt 2>&1
  echo "mark_race round $i: $(grep -c WRONG $OUT/mark_race_$i.txt) wrong [${SECONDS}s]"
done
echo "done [${SECONDS}s]"
