"""How the PyTorch profiler (Kineto) JSON path scales: tile a real Kineto trace to ~450 MB
of JSON and time, in fresh subprocesses, the load alone and the whole ``recsys-doctor
advise --json`` command, on the plain file and on its gzip copy (``gzip -6``, as
``torch.profiler`` writes ``.json.gz``). Each command runs ``--repeat`` times; the
fastest wall time and the largest peak RSS (the child's ``ru_maxrss``) are reported, with
the load average around each measurement (the machine may be shared).

``--before ROOT`` measures another checkout (its own ``.venv``) on the same files in the
same run, interleaved with this one, e.g. the main branch before a change.

    python bench/scale/kineto_scale.py [--mb 450] [--repeat 3] [--before ../main] [--out FILE]

The generated files go to a temporary directory (``--tmp``) and are deleted after use.
``tile_to_size`` and ``kineto_child`` are also what ``bench/scale/scale_trace.py`` uses for its
Kineto row; the timing both share is in ``_timing.py``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import best_of, machine, run_cmd, version  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KINETO = ROOT.parent / "shared" / "traces" / "kineto" / \
    "facebookresearch__HolisticTraceAnalysis__tests__data__df_index_resolver__df_index_resolver.json.gz"
LOAD = "import sys; from recsys_doctor.loaders import load; load(sys.argv[1])"


def tile_kineto(src: Path, dst: Path, k: int) -> int:
    """Write a K-times tiled copy of a Kineto JSON trace (events shifted by K x the
    trace span, correlation and flow ids offset); return the number of events."""
    import msgspec

    raw = gzip.open(src).read() if src.suffix == ".gz" else src.read_bytes()
    doc = msgspec.json.decode(raw)
    events = doc.pop("traceEvents")
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 1000
    corr = max((e.get("args") or {}).get("correlation", 0) or 0 for e in events
               if isinstance((e.get("args") or {}).get("correlation", 0), int)) + 1
    fid = max((e.get("id", 0) for e in events if isinstance(e.get("id"), int)), default=0) + 1
    n = 0
    with open(dst, "wb") as f:
        head = msgspec.json.encode(doc)[:-1]
        f.write(head + (b", " if doc else b"") + b'"traceEvents": [\n')
        first = True
        for i in range(k):
            for e in events:
                if i and e.get("ph") == "M":
                    continue  # metadata once
                if i:
                    e = _shifted(e, i * span, i * fid, i * corr)
                f.write((b"" if first else b",\n") + msgspec.json.encode(e))
                first = False
                n += 1
        f.write(b"\n]}\n")
    return n


def tile_kineto_in_child(src: Path, dst: Path, k: int) -> int:
    """:func:`tile_kineto` in a separate process: a child's peak RSS (``ru_maxrss``) counts
    the memory of the process it was forked from, so the bench itself must stay small."""
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); "
            "from pathlib import Path; from kineto_scale import tile_kineto; "
            "print(tile_kineto(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])))")
    r = subprocess.run([sys.executable, "-c", code, str(src), str(dst), str(k)],
                       capture_output=True, text=True, check=True)
    return int(r.stdout.split()[-1])


def tile_to_size(src: Path, tmp: Path, mb: float) -> tuple[Path, int, int]:
    """``(file, factor, events)``: ``src`` tiled to about ``mb`` MiB of JSON in ``tmp``."""
    one = tmp / "kineto_1.json"
    tile_kineto_in_child(src, one, 1)
    k = max(1, round(mb * 2**20 / one.stat().st_size))
    one.unlink()
    f = tmp / f"kineto_{k}.json"
    return f, k, tile_kineto_in_child(src, f, k)


def _shifted(e: dict, dt_us: float, did: int, dcorr: int) -> dict:
    e = dict(e)
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = e["ts"] + dt_us
    if isinstance(e.get("id"), int):
        e["id"] = e["id"] + did
    a = e.get("args")
    if isinstance(a, dict) and isinstance(a.get("correlation"), int) and a["correlation"] > 0:
        e["args"] = dict(a, correlation=a["correlation"] + dcorr)
    return e


def kineto_child(path: Path, repeat: int, python: str = sys.executable, cwd: Path | None = None) -> dict:
    """Load alone and the whole ``advise --json``, each ``repeat`` times in a fresh process."""
    load = [python, "-c", LOAD, str(path)]
    advise = [python, "-m", "recsys_doctor", "advise", "--json", "--no-history", str(path)]
    out = {}
    for what, cmd in (("load_only", load), ("advise", advise)):
        before = os.getloadavg()[0]
        out[what] = best_of([run_cmd(cmd, cwd=cwd) for _ in range(repeat)])
        out[what]["load_avg"] = [round(before, 2), round(os.getloadavg()[0], 2)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", type=Path, default=KINETO)
    ap.add_argument("--mb", type=float, default=450, help="size of the tiled JSON in MiB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", type=Path, help="another checkout (with its .venv) to measure alongside")
    ap.add_argument("--tmp", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "scale" / "results" / f"kineto_{dt.date.today()}.json")
    a = ap.parse_args()
    runs = {"this": (sys.executable, ROOT)}
    if a.before:
        runs["before"] = (str(a.before.resolve() / ".venv" / "bin" / "python"), a.before.resolve())
    doc: dict = {"what": __doc__.split("\n\n")[0], "trace": a.trace.name,
                 "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
                 "code": {k: version(root) for k, (_, root) in runs.items()}, "files": []}
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmpd:
        tmp = Path(tmpd)
        plain, k, n = tile_to_size(a.trace, tmp, a.mb)
        gz = tmp / f"kineto_{k}.json.gz"
        with open(gz, "wb") as g:
            subprocess.run(["gzip", "-6", "-c", str(plain)], stdout=g, check=True)
        for f in (plain, gz):
            row: dict = {"file": f.name, "factor": k, "events": n, "file_mb": round(f.stat().st_size / 2**20, 1),
                         "json_mb": round(plain.stat().st_size / 2**20, 1)}
            for name, (py, root) in runs.items():
                row[name] = kineto_child(f, a.repeat, py, root)
                print(json.dumps({"file": f.name, name: row[name]}), file=sys.stderr, flush=True)
            doc["files"].append(row)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
