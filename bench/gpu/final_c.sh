# One device call: every GPU test file but the scripts suite, each in its own process, then the
# held-out scripts through profile --apply (rows into heldout_h100.json, the hook's stats of
# each run beside). Everything lands in $OUT/final.tgz.
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh
O=/tmp/final; mkdir -p "$O"; cp "$OUT/env.json" "$O/"
for f in $(grep -l "pytest.mark.gpu" tests/test_*.py | grep -v -e scripts_suite -e heldout); do
  n=$(basename "$f" .py)
  timeout 200 python3 -m pytest -q -m gpu "$f" -p no:cacheprovider --tb=short > "$O/$n.log" 2>&1
  echo "$f rc $? $(tail -1 "$O/$n.log")"
done
grep -h -E "^FAILED|^E  " "$O"/test_*.log | head -20
RECSYS_DOCTOR_WRITE_SUITE=$O/heldout_h100.json timeout 420 python3 -m pytest -q -m gpu tests/test_heldout_gpu.py \
  -p no:cacheprovider --tb=short --basetemp=/tmp/ho_tmp > "$O/test_heldout_gpu.log" 2>&1
echo "heldout rc $? $(tail -1 "$O/test_heldout_gpu.log")"
for d in /tmp/ho_tmp/test_*/; do n=$(basename "$d"); mkdir -p "$O/heldout_runs/$n"
  cp "$d"apply/apply.json "$d"apply/after/hook_stats.json "$O/heldout_runs/$n/" 2>/dev/null
  cp "$d"apply/cand_1.hook_stats.json "$O/heldout_runs/$n/" 2>/dev/null; done
tar czf "$OUT/final.tgz" -C "$O" . && echo "total $(( $(date +%s) - t0 )) s"
