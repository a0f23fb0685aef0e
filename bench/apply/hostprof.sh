#!/usr/bin/env bash
# One device call: where the hooked scripts' host time goes (py-spy --gil, bench/apply/gil_profile.py)
# for the suite's serving scripts and the plain script, unhooked and under a fixed plan; plus the
# hook's GPU tests. Everything lands in $OUT/hostprof.tgz.
# usage: bash bench/apply/hostprof.sh [tests] [deepfm] [deepfm_stage] [dlrm] [plain] [mmoe] [nsys_dlrm] [bt_dlrm] [bt_mmoe] [bt_plain] [bt_cand]
# (bt_*: the native call stack of every GIL wait, summed by bench/apply/gil_waits.py)
export CUDA_DEVICE_MAX_CONNECTIONS=32
. bench/gpu/gpu_setup.sh
O=/tmp/hostprof; mkdir -p "$O"; cp "$OUT/env.json" "$O/"
prof() { local name=$1 g=$2; shift 2; RD_GROUPS=$g timeout 300 python3 bench/apply/gil_profile.py "$O/$name" "$@" > "$O/$name.log" 2>&1
  echo "$name rc $? $(grep -h '^\(un\)\?hooked: {' "$O/$name.log" | cut -c1-160 | tr '\n' ' ')"; }
for w in ${*:-tests deepfm deepfm_stage dlrm plain mmoe}; do
  case $w in
    tests) for f in tests/test_autoapply_gpu.py tests/test_apply_gpu.py; do n=$(basename "$f" .py)
             timeout 200 python3 -m pytest -q -m gpu "$f" -p no:cacheprovider --tb=short > "$O/$n.log" 2>&1
             echo "$f rc $? $(tail -1 "$O/$n.log")"; done;;
    deepfm) prof deepfm 4 examples/scripts/deepfm_serve.py --threads 4 --queries 2000;;
    deepfm_stage) RECSYS_DOCTOR_STAGE_PAGEABLE=1 prof deepfm_stage 4 examples/scripts/deepfm_serve.py --threads 4 --queries 2000;;
    dlrm) prof dlrm 2 examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 3000;;
    plain) prof plain 4 examples/plain_serving_script.py --threads 8 --duration 3;;
    mmoe) prof mmoe 8 examples/scripts/mmoe_ranker.py --threads 4 --queries 3000;;
    nsys_dlrm)  # a timeline of the hooked DLRM script (g4): CUDA API, OS runtime, CPU samples
      python3 -c "from recsys_doctor.planning.io import write_plan; from recsys_doctor.planning.whatif import Candidate; write_plan('$O/g4.json', {}, Candidate(4, True, False, True))"
      timeout 200 python3 -m recsys_doctor apply "$O/g4.json" -- nsys profile -t cuda,osrt,nvtx --sample=none \
        --cpuctxsw=none -o "$O/dlrm_g4" -f true python3 examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 1500 \
        > "$O/nsys_dlrm.log" 2>&1; echo "nsys_dlrm rc $? $(grep '^{' "$O/nsys_dlrm.log" | tail -1)"
      nsys export --type sqlite -o "$O/dlrm_g4.sqlite" "$O/dlrm_g4.nsys-rep" >> "$O/nsys_dlrm.log" 2>&1
      rm -f "$O/dlrm_g4.nsys-rep"; gzip -f "$O/dlrm_g4.sqlite"; ls -la "$O"/dlrm_g4*;;
    bt_dlrm|bt_mmoe|bt_plain|bt_cand)  # native call stacks of every OS-runtime wait >= 5 us (the GIL waits), hooked g4
      python3 -c "from recsys_doctor.planning.io import write_plan; from recsys_doctor.planning.whatif import Candidate; write_plan('$O/g4.json', {}, Candidate(4, True, False, True))"
      case $w in bt_dlrm) s="examples/scripts/dlrm_numpy_serve.py --threads 4 --queries 1500";;
                 bt_mmoe) s="examples/scripts/mmoe_ranker.py --threads 4 --queries 1500";;
                 bt_plain) s="examples/plain_serving_script.py --threads 8 --duration 2";;
                 bt_cand) s="examples/scripts/candidates_ranker.py --threads 4 --queries 1500";; esac
      timeout 240 python3 -m recsys_doctor apply "$O/g4.json" -- nsys profile -t osrt --sample=none --cpuctxsw=none \
        --osrt-threshold=5000 --osrt-backtrace-threshold=5000 --backtrace=dwarf -o "$O/$w" -f true python3 $s \
        > "$O/$w.log" 2>&1; echo "$w rc $? $(grep '^{' "$O/$w.log" | tail -1 | cut -c1-200)"
      nsys export --type sqlite -o "$O/$w.sqlite" "$O/$w.nsys-rep" >> "$O/$w.log" 2>&1
      python3 bench/apply/gil_waits.py "$O/$w.sqlite" > "$O/$w.waits.txt" 2>&1; head -40 "$O/$w.waits.txt"
      rm -f "$O/$w.nsys-rep" "$O/$w.sqlite";;
  esac
done
find "$O" -name '*.folded' -exec gzip -f {} \;
tar czf "$OUT/hostprof.tgz" -C "$O" . && echo "total $(( $(date +%s) - t0 )) s"
