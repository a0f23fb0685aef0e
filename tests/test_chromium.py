"""The HTML report in a real browser: headless Chromium (Debian's ``chromium``).

The report itself has no script. For the check, a *copy* gets a tiny script at the top of
``<head>`` that counts console errors and failed loads, and after ``load`` writes into
``document.title`` how many ``<img>`` decoded (``naturalWidth > 0``), how many did not,
and how many external resources the page fetched. ``--dump-dom`` gives us the title back;
``--enable-logging=stderr`` gives every console message (the report has no script, so any
console message at all is unexpected). A negative control proves the probe can fail.

The screenshot of the unmodified report is kept in ``tests/artifacts/`` (git-ignored).
``make test`` installs Chromium through ``tests/ensure_chromium.sh`` when it can.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from recsys_doctor.reports.html import write_html

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
ROOT = Path(__file__).resolve().parents[1]
SHARED_SERIAL = ROOT.parent / "shared" / "traces" / "h100" / "wdl_serial_q4_h100.sqlite"
FIXTURE = Path(__file__).resolve().parent / "data" / "wdl_graphs_q4" / "wdl_graphs_q4.sqlite.gz"

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="headless Chromium not installed (/usr/bin/chromium missing; `make test` installs Debian's "
           "'chromium' package when run as root, see tests/ensure_chromium.sh)")

PROBE = """<script>
window.__errs = 0;
(function () {
  var ce = console.error;
  console.error = function () { window.__errs++; return ce.apply(console, arguments); };
  window.addEventListener('error', function () { window.__errs++; }, true);
  window.addEventListener('load', function () {
    var im = document.images, ok = 0, bad = 0;
    for (var i = 0; i < im.length; i++) { if (im[i].complete && im[i].naturalWidth > 0) ok++; else bad++; }
    var res = performance.getEntriesByType('resource').length;
    document.title = 'PROBE ok=' + ok + ' bad=' + bad + ' errs=' + window.__errs + ' res=' + res;
  });
})();
</script>"""

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--disable-extensions", "--mute-audio"]


def _chromium(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    ud = tmp / f"ud{len(list(tmp.glob('ud*')))}"
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={ud}", *args], capture_output=True, text=True,
                          timeout=120)


def _probe(html_file: Path, tmp: Path) -> tuple[dict[str, int], list[str]]:
    """Load a probed copy; return the title counters and the console lines."""
    doc = html_file.read_text(encoding="utf-8")
    probed = tmp / f"probed_{html_file.name}"
    probed.write_text(doc.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    p = _chromium(["--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", "--dump-dom",
                   probed.as_uri()], tmp)
    m = re.search(r"<title>PROBE ok=(\d+) bad=(\d+) errs=(\d+) res=(\d+)</title>", p.stdout)
    assert m, f"probe did not run (rc {p.returncode}); stderr tail: {p.stderr[-1500:]}"
    counts = dict(zip(("ok", "bad", "errs", "res"), map(int, m.groups())))
    console = [ln for ln in p.stderr.splitlines() if ":CONSOLE" in ln]
    return counts, console


def _report_result():
    from recsys_doctor.diagnose.advise import advise, advise_trace

    if SHARED_SERIAL.exists():
        return advise(SHARED_SERIAL), "serial"
    if FIXTURE.exists():
        return advise(FIXTURE), "fixture"
    from recsys_doctor.model import Trace

    k = [{"start": i * 10_000, "end": i * 10_000 + 2_000, "pid": 1, "device": 0, "stream": 7,
          "correlation": i + 1, "name": f"k{i % 3}"} for i in range(50)]
    a = [{"start": i * 10_000 - 5_000, "end": i * 10_000 - 1_000, "pid": 1, "tid": 10 + i % 2,
          "correlation": i + 1, "name": "cudaLaunchKernel", "api_class": "runtime"} for i in range(50)]
    return advise_trace(Trace(path="hand-built.sqlite", format="test", kernels=pd.DataFrame(k),
                              api=pd.DataFrame(a))), "hand-built"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, str]:
    res, which = _report_result()
    out = tmp_path_factory.mktemp("chromium") / "report.html"
    write_html(res, out)
    return out, which


def test_report_loads_with_images_and_no_console_errors(report, tmp_path):
    html_file, _which = report
    n_img = html_file.read_text(encoding="utf-8").count("<img ")
    assert n_img >= 3
    counts, console = _probe(html_file, tmp_path)
    assert counts == {"ok": n_img, "bad": 0, "errs": 0, "res": 0}
    assert console == [], console


def test_probe_can_fail(report, tmp_path):
    """Negative control: a broken image and a console error must be caught."""
    html_file, _ = report
    doc = html_file.read_text(encoding="utf-8")
    broken = tmp_path / "broken.html"
    broken.write_text(doc.replace("</main>", '<img src="data:image/png;base64,AAAA" alt="x">'
                                  "<script>console.error('boom')</script></main>", 1), encoding="utf-8")
    counts, console = _probe(broken, tmp_path)
    assert counts["bad"] == 1 and counts["errs"] >= 1
    assert any("boom" in ln for ln in console)


def test_screenshot_artifact(report, tmp_path):
    html_file, which = report
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / f"report_{which}.png"
    shot.unlink(missing_ok=True)
    p = _chromium([f"--screenshot={shot}", "--window-size=1400,3000", html_file.as_uri()], tmp_path)
    assert shot.exists(), p.stderr[-1500:]
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", head[16:24])
    assert (w, h) == (1400, 3000)
