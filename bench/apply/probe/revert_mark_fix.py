"""Put back, in this checkout, the read-mark code as it was before session 27's fix, to show that
the busy-stream GPU test catches the fault: ``python bench/apply/probe/revert_mark_fix.py order``
(the group stream synchronized before the mark's counter is zeroed, as before; ReadMark.captured's
check kept: the fault then refuses the thread graph) or ``... all`` (the check dropped too: the fault
then gives wrong outputs). The probe restores the files from copies afterwards."""

import sys
from pathlib import Path

root = Path(__file__).resolve().parents[3] / "recsys_doctor/applying/_autoapply"
tg = root / "thread_graphs.py"
s = tg.read_text()
i = s.index("    stream = g.streams.side_stream()\n")
j = s.index("    torch.cuda.current_stream().synchronize()  # (where the script set its own stream)\n")
j += len("    torch.cuda.current_stream().synchronize()  # (where the script set its own stream)\n")
s = s[:i] + ("    stream = g.streams.side_stream()\n    g.stream.synchronize()\n\n    with normal_tensors(torch):\n"
             "        mark = ReadMark(torch, tin[0].device) if tin else None\n") + s[j:]
tg.write_text(s)
if sys.argv[1:] == ["all"]:
    rm = root / "readmark.py"
    r = rm.read_text()
    k = r.index("        if self.base != counted:\n")
    r = r[:k] + r[r.index("\n", r.index("raise RuntimeError", k)) + 1:]
    rm.write_text(r)
print("reverted:", sys.argv[1:])
