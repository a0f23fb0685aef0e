# Two new held-out scripts through profile --apply: seqrec_serve.py (a Transformer over padded
# click histories, nn.TransformerEncoder on PyTorch's nested-tensor fast path, the padded width
# changing between requests) and sparse_amp_train.py (sparse EmbeddingBag gradients, SparseAdam +
# AdamW, float16 autocast with a GradScaler, an Apex-style side-stream prefetcher). Each run as it
# is first (stdout kept), then the GPU test; the tool's apply.json and logs tarred back.
. bench/gpu/gpu_setup.sh >/dev/null 2>&1
export SETUP_DONE=1 CUDA_DEVICE_MAX_CONNECTIONS=32
export RECSYS_DOCTOR_WRITE_SUITE=$OUT/heldout_rows.json
python3 examples/heldout/seqrec_serve.py --threads 4 --queries 3000 > $OUT/seqrec_plain.txt 2>&1
python3 examples/heldout/sparse_amp_train.py --epochs 2 > $OUT/sparse_amp_plain.txt 2>&1
tail -1 $OUT/seqrec_plain.txt; tail -1 $OUT/sparse_amp_plain.txt
T=${T:-300} gpu_test heldout_seqrec tests/test_heldout_gpu.py -k seqrec --basetemp=/tmp/bt
T=$(( 575 - SECONDS )) gpu_test heldout_sparse_amp tests/test_heldout_gpu.py -k sparse_amp --basetemp=/tmp/bt2
cd /tmp && find bt bt2 -name 'apply.json' -o -name '*.log' 2>/dev/null | head -60 > /tmp/list
tar czf $OUT/bt.tgz -T /tmp/list 2>/dev/null; rm -f $OUT/setup.log
