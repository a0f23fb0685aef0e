#!/usr/bin/env bash
# One device call of issue-8 work on the GPU machine: set-up, then the named parts, each with
# its own time limit, logs and results under $OUT.  usage: bash bench/gpu_session.sh PART...
# parts: tests alltests applytests threadgraph anchors variants harness apply (wdl + script + mmoe through bench/apply_acceptance.sh)
#        prof8 (nsys + advise of the hand-roll and the runtime at Q=8) hookdiag (plain script, 4 threads/group);
# carry .whl and .gpu-libs
. bench/gpu_setup.sh
for part in "$@"; do
  s=$(date +%s)
  case $part in
    tests)
      timeout 240 python3 -m pytest -q -m gpu tests/test_runtime_gpu.py -p no:cacheprovider -x > "$OUT/gpu_tests.log" 2>&1
      echo "tests rc=$?"; tail -4 "$OUT/gpu_tests.log";;
    anchors)
      OUT=$OUT timeout ${ANCHORS_TIMEOUT:-330} python3 bench/serve_anchors.py > "$OUT/anchors.log" 2>&1
      echo "anchors rc=$?"; tail -40 "$OUT/anchors.log";;
    alltests)
      timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q -m gpu tests -p no:cacheprovider -rs > "$OUT/gpu_tests_all.log" 2>&1
      echo "alltests rc=$?"; tail -6 "$OUT/gpu_tests_all.log";;
    variants)  # the runtime's hot-path variants at Q=8 against the pre-packed hand-roll, one run
      mkdir -p "$OUT/v"
      OUT=$OUT/v QS=1,4,8 CONFIGS=graph_prepacked,serve,serve_request NAME=default.json timeout 120 python3 bench/serve_anchors.py > "$OUT/v/default.log" 2>&1
      OUT=$OUT/v QS=8 CONFIGS=serve,serve_request NAME=release_gil.json RECSYS_DOCTOR_LAUNCH=release-gil timeout 60 python3 bench/serve_anchors.py > "$OUT/v/release_gil.log" 2>&1
      OUT=$OUT/v QS=8 CONFIGS=serve,serve_request NAME=copies_outside.json RECSYS_DOCTOR_GRAPH_COPIES=outside timeout 60 python3 bench/serve_anchors.py > "$OUT/v/copies_outside.log" 2>&1
      OUT=$OUT/v QS=8 CONFIGS=serve,serve_request NAME=slots1.json SERVE_SLOTS=1 timeout 60 python3 bench/serve_anchors.py > "$OUT/v/slots1.log" 2>&1
      OUT=$OUT/v QS=8 CONFIGS=serve,serve_request NAME=groups4.json SERVE_GROUPS=4 timeout 60 python3 bench/serve_anchors.py > "$OUT/v/groups4.log" 2>&1
      for f in "$OUT"/v/*.json; do echo "== $(basename "$f")"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps(d['qps_table']), json.dumps(d['ratio_to_graph_prepacked']))" "$f"; done
      (cd "$OUT" && tar czf variants.tgz v && rm -rf v);;
    prof8)  # where the Q=8 time goes: our own diagnosis of the hand-roll and the runtime
      for c in graph_prepacked serve_request; do
        timeout 90 nsys profile -t cuda,nvtx,osrt --sample=none --cpuctxsw=none -o /tmp/p_$c -f true \
          python3 bench/serve_anchors.py --one $c 8 1 > "$OUT/prof_$c.log" 2>&1
        nsys export --type sqlite -o /tmp/p_$c.sqlite /tmp/p_$c.nsys-rep >> "$OUT/prof_$c.log" 2>&1
        recsys-doctor advise /tmp/p_$c.sqlite --json > "$OUT/advise_$c.json" 2>> "$OUT/prof_$c.log"
        recsys-doctor advise /tmp/p_$c.sqlite 2>&1 | head -30
      done;;
    hookdiag)  # the plain script through the hook with 4 and 2 threads per graphed group
      for g in 2 4; do
        echo "{\"runtime\": {\"groups\": $g, \"cuda_graphs\": true}}" > /tmp/plan_g$g.json
        RECSYS_DOCTOR_AUTOAPPLY_LOG=1 RECSYS_DOCTOR_AUTOAPPLY_DEBUG=1 timeout 90 recsys-doctor apply /tmp/plan_g$g.json -- \
          python3 examples/plain_serving_script.py --threads 8 --duration 2 > "$OUT/hook_g$g.log" 2>&1
        echo "groups=$g rc=$?"; grep -v "^ " "$OUT/hook_g$g.log" | tail -12
      done;;
    applytests)  # the hook's GPU tests (tests/test_apply_gpu.py) and its CPU ones beside them
      timeout ${TESTS_TIMEOUT:-300} python3 -m pytest -q tests/test_apply_gpu.py tests/test_autoapply_copies.py \
        tests/test_autoapply_gate.py tests/test_autoapply_key.py -p no:cacheprovider -rs > "$OUT/apply_tests.log" 2>&1
      echo "applytests rc=$?"; tail -8 "$OUT/apply_tests.log";;
    threadgraph)  # the plain script, 8 threads, through `apply` with thread graphs off and on, eager beside
      : > "$OUT/threadgraph.jsonl"
      for g in 8 4; do echo "{\"runtime\": {\"groups\": $g, \"cuda_graphs\": true}}" > /tmp/plan_g$g.json; done
      for round in $(seq 1 ${ROUNDS:-3}); do
        r=$(timeout 60 python3 examples/plain_serving_script.py --threads 8 --duration 2 2>>"$OUT/threadgraph.err" | tail -1)
        echo "{\"round\": $round, \"config\": \"eager\", \"result\": ${r:-null}}" >> "$OUT/threadgraph.jsonl"
        for cfg in g8_off g8_on g4_on; do
          g=${cfg%_*}; g=${g#g}; tg=$([ "${cfg#*_}" = on ] && echo 1 || echo 0)
          r=$(RECSYS_DOCTOR_THREAD_GRAPHS=$tg RECSYS_DOCTOR_AUTOAPPLY_LOG=1 timeout 90 recsys-doctor apply /tmp/plan_g$g.json -- \
              python3 examples/plain_serving_script.py --threads 8 --duration 2 2>>"$OUT/threadgraph.err" | tail -1)
          echo "{\"round\": $round, \"config\": \"$cfg\", \"result\": ${r:-null}}" >> "$OUT/threadgraph.jsonl"
        done
      done
      python3 -c "
import json,sys
for l in open(sys.argv[1]):
    d=json.loads(l); r=d['result'] or {}
    print(d['round'], d['config'], r.get('qps'), r.get('p99_ms'), r.get('checksum'))" "$OUT/threadgraph.jsonl"
      grep "recsys-doctor apply: {" "$OUT/threadgraph.err" | tail -4;;
    harness)  # what the workload driver adds on top of the runtime (bench/harness_overhead.py)
      OUT=$OUT timeout ${HARNESS_TIMEOUT:-200} python3 bench/harness_overhead.py > "$OUT/harness.log" 2>&1
      echo "harness rc=$?"; cat "$OUT/harness.log";;
    apply)
      OUT=$OUT/apply timeout ${APPLY_TIMEOUT:-400} bash bench/apply_acceptance.sh ${APPLY_PARTS:-wdl script mmoe} > "$OUT/apply.log" 2>&1
      echo "apply rc=$?"; tail -60 "$OUT/apply.log"
      (cd "$OUT" && tar czf apply.tgz apply && rm -rf apply);;
  esac
  echo "part $part $(( $(date +%s) - s )) s"
done
