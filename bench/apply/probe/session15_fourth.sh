# A held-out training loop that logs its loss and prints no step time (examples/heldout/log_train.py)
# through profile --apply: measured by the hook's optimizer-step meter (d5d659a, not yet GPU-run),
# every run's checksum (losses and trained tables) within the training tolerance.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
python3 examples/heldout/log_train.py --steps 600 > $OUT/log_train_plain.txt 2>&1
T=${T:-400} gpu_test heldout_log_train tests/test_heldout_gpu.py -k log_train --basetemp=/tmp/bt
cd /tmp/bt && find . -name 'apply.json' -o -name '*.log' | head -40 > /tmp/list
tar czf $OUT/bt.tgz -T /tmp/list 2>/dev/null; rm -f $OUT/setup.log
