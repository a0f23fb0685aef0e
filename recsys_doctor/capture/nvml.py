"""NVML sampling during a capture: GPU utilization, SM clock and memory every ~50 ms.

A background thread polls NVML (``pynvml``, from the ``nvidia-ml-py`` package) while the
profiled program runs - in the same process for the torch backend, from the parent
while the ``nsys`` child runs. NVML's utilization counter is the share of the driver's
last sample period (1/6 s to 1 s depending on the GPU) in which any kernel was running,
so it says "busy" for a GPU running one tiny kernel at a time: it is the number people
quote, not a measure of how full the SMs are. The trace-based utilization in the advise
summary is the other half of the picture.

No GPU, no driver or no pynvml is not an error: the sampler then has no samples and a
``reason`` that says why, and the run goes on.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["NvmlSampler", "NvmlSamples", "DEFAULT_INTERVAL_S", "plot_samples", "gpu_environment"]

#: polling period; NVML itself updates utilization more slowly, clocks and memory are instant
DEFAULT_INTERVAL_S = 0.05


@dataclass
class NvmlSamples:
    """Samples of one run. Each sample: ``t_s`` (seconds since the sampler started),
    ``util_gpu`` and ``util_mem`` (percent), ``sm_clock_mhz``, ``mem_used_mib``."""

    device_index: int
    interval_s: float
    samples: list[dict[str, float]] = field(default_factory=list)
    device_name: str | None = None
    driver: str | None = None
    #: why there are no samples (None when sampling worked)
    reason: str | None = None

    def summary(self, window_epoch: list[float] | tuple[float, float] | None = None) -> dict[str, Any]:
        """Mean/p50/max utilization, mean SM clock, peak memory - or the reason.
        ``window_epoch`` (Unix seconds ``[start, end]``) keeps only the samples inside it,
        e.g. the measurement window, so process start-up and model loading, when the GPU
        is idle, do not dilute the numbers."""
        samples = self.samples
        if window_epoch and len(window_epoch) == 2 and samples and "t_epoch" in samples[0]:
            lo, hi = window_epoch
            samples = [s for s in samples if lo <= s["t_epoch"] <= hi]
        out: dict[str, Any] = {"device_index": self.device_index, "device": self.device_name,
                               "driver": self.driver, "interval_s": self.interval_s, "n": len(samples),
                               "n_total": len(self.samples)}
        if window_epoch:
            out["window_epoch"] = list(window_epoch)
        if not samples:
            out["reason"] = self.reason or "no samples (the run was shorter than one sampling period)"
            return out
        u = [s["util_gpu"] for s in samples]
        out.update({
            "util_mean": round(statistics.fmean(u), 2),
            "util_p50": float(statistics.median(u)),
            "util_max": float(max(u)),
            "mem_util_mean": round(statistics.fmean(s["util_mem"] for s in samples), 2),
            "sm_clock_mean_mhz": round(statistics.fmean(s["sm_clock_mhz"] for s in samples), 1),
            "mem_used_max_mib": round(max(s["mem_used_mib"] for s in samples), 1),
            "duration_s": round(samples[-1]["t_s"] - samples[0]["t_s"], 3),
        })
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"device_index": self.device_index, "device": self.device_name, "driver": self.driver,
                "interval_s": self.interval_s, "reason": self.reason, "summary": self.summary(),
                "samples": self.samples}

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_dict(), indent=1))
        return p


def _load_nvml() -> tuple[Any, str | None]:
    try:
        import pynvml
    except ImportError:
        return None, "pynvml not installed (pip install nvidia-ml-py)"
    if pynvml is None:  # an import blocked with sys.modules['pynvml'] = None
        return None, "pynvml not installed (pip install nvidia-ml-py)"
    return pynvml, None


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class NvmlSampler:
    """``with NvmlSampler(0) as s: run()`` then ``s.result`` (an :class:`NvmlSamples`).

    ``nvml`` may be given (a module with the pynvml API) for testing; otherwise ``pynvml``
    is imported. Sampling errors after a successful start end the sampling and are kept
    as the reason; they never propagate into the profiled run."""

    def __init__(self, device_index: int = 0, interval_s: float = DEFAULT_INTERVAL_S, nvml: Any = None,
                 enabled: bool = True) -> None:
        self.device_index = device_index
        self.interval_s = interval_s
        self.result = NvmlSamples(device_index, interval_s)
        self._nvml = nvml
        self._enabled = enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: Any = None

    def start(self) -> "NvmlSampler":
        if not self._enabled:
            self.result.reason = "NVML sampling switched off (--no-nvml)"
            return self
        nv = self._nvml
        if nv is None:
            nv, why = _load_nvml()
            if nv is None:
                self.result.reason = why
                return self
            self._nvml = nv
        try:
            nv.nvmlInit()
        except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
            self.result.reason = f"NVML unavailable: {e or type(e).__name__}"
            self._nvml = None
            return self
        try:
            count = nv.nvmlDeviceGetCount()
            if self.device_index >= count:
                raise LookupError(f"GPU {self.device_index} not present ({count} GPUs)")
            self._handle = nv.nvmlDeviceGetHandleByIndex(self.device_index)
            self.result.device_name = _text(nv.nvmlDeviceGetName(self._handle))
            self.result.driver = _text(nv.nvmlSystemGetDriverVersion())
        except Exception as e:  # noqa: BLE001 - NVMLError or our LookupError: kept as the reason, never raised
            self.result.reason = f"NVML: {e or type(e).__name__}"
            self._shutdown()
            return self
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="recsys-doctor-nvml", daemon=True)
        self._thread.start()
        return self

    def _sample(self, t0: float) -> dict[str, float]:
        nv, h = self._nvml, self._handle
        u = nv.nvmlDeviceGetUtilizationRates(h)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        clk = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
        return {"t_s": round(time.perf_counter() - t0, 4), "t_epoch": time.time(), "util_gpu": float(u.gpu), "util_mem": float(u.memory),
                "sm_clock_mhz": float(clk), "mem_used_mib": round(mem.used / 2**20, 1)}

    def _loop(self) -> None:
        t0 = time.perf_counter()
        nxt = t0
        while True:
            try:
                self.result.samples.append(self._sample(t0))
            except Exception as e:  # noqa: BLE001 - a sampling thread: kept as the reason, never raised into the run
                self.result.reason = f"NVML sampling stopped: {e or type(e).__name__}"
                return
            nxt += self.interval_s
            if self._stop.wait(max(0.0, nxt - time.perf_counter())):
                return

    def stop(self) -> NvmlSamples:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self._shutdown()
        return self.result

    def _shutdown(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - best effort
                pass
            self._nvml = None

    def __enter__(self) -> "NvmlSampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def gpu_environment(device_index: int = 0) -> dict[str, Any]:
    """GPU name and driver from NVML (``{}`` plus a reason when NVML is unavailable)."""
    nv, why = _load_nvml()
    if nv is None:
        return {"nvml": why}
    try:
        nv.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...: the reason
        return {"nvml": f"NVML unavailable: {e or type(e).__name__}"}
    try:
        count = nv.nvmlDeviceGetCount()
        out: dict[str, Any] = {"gpu_count": int(count), "driver": _text(nv.nvmlSystemGetDriverVersion())}
        if device_index < count:
            out["gpu"] = _text(nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(device_index)))
        try:
            v = nv.nvmlSystemGetCudaDriverVersion()
            out["cuda_driver"] = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception:  # noqa: BLE001 - an old driver without it: the field is left out
            pass
        return out
    except Exception as e:  # noqa: BLE001 - environment facts are best effort: the reason instead
        return {"nvml": f"NVML: {e or type(e).__name__}"}
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - best effort
            pass


def plot_samples(samples: NvmlSamples, path: str | Path, title: str = "") -> Path | None:
    """A PNG of utilization, SM clock and memory over time; ``None`` when there are no
    samples (nothing to plot is not an error)."""
    if not samples.samples:
        return None
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    t = [s["t_s"] for s in samples.samples]
    fig, axes = plt.subplots(3, 1, figsize=(8, 6), sharex=True)
    axes[0].plot(t, [s["util_gpu"] for s in samples.samples], label="GPU util %")
    axes[0].plot(t, [s["util_mem"] for s in samples.samples], label="memory util %", alpha=0.7)
    axes[0].set_ylim(0, 105)
    axes[0].set_ylabel("%")
    axes[0].legend(loc="upper right", fontsize=8)
    axes[1].plot(t, [s["sm_clock_mhz"] for s in samples.samples], color="tab:green")
    axes[1].set_ylabel("SM clock MHz")
    axes[2].plot(t, [s["mem_used_mib"] for s in samples.samples], color="tab:red")
    axes[2].set_ylabel("memory MiB")
    axes[2].set_xlabel("seconds")
    s = samples.summary()
    fig.suptitle(title or f"{samples.device_name or 'GPU'}: mean util {s['util_mean']}%, p50 {s['util_p50']}%")
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p, dpi=90)
    plt.close(fig)
    return p
