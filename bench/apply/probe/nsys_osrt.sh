# Sourced by session28_second.sh, _fourth.sh and _fifth.sh (after bench/gpu/gpu_setup.sh): the
# DLRM script's g4 plan in $O/g4.json, NS (nsys with OS-runtime call stacks of every call of 5 us or
# more), and osrt_run NAME CMD... (CMD, whose nsys -o is $O/NAME, run and exported to $O/NAME.sqlite;
# its rc and JSON line echoed). The caller reads the export and removes it (~100 MB).
O=/tmp/bt; mkdir -p $O
python3 -c "from recsys_doctor.planning.io import write_plan; from recsys_doctor.planning.whatif import Candidate; write_plan('$O/g4.json', {}, Candidate(4, True, False, True))"
NS="nsys profile -t osrt --sample=none --cpuctxsw=none --osrt-threshold=5000 --osrt-backtrace-threshold=5000 --backtrace=dwarf -f true"
osrt_run() { local w=$1; shift
  timeout 200 "$@" > $O/$w.log 2>&1; echo "$w rc $? $(grep '^{' $O/$w.log | tail -1 | cut -c1-200)"
  nsys export --type sqlite -o $O/$w.sqlite $O/$w.nsys-rep >> $O/$w.log 2>&1; }
