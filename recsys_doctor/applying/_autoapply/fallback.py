"""Fallback accounting: what the hook does when a capture or a replay fails - the reason is
logged once and counted in ``stats()['fallbacks']``, and the call runs eagerly from then on."""

from __future__ import annotations

import linecache
import os
import re
import sys
from typing import Any

from ._common import _first_line, _log, _state
from .accounting import _display, _skipped

#: an ATen operator named in an exception's text (``aten::nonzero``, ``aten::_local_scalar_dense``)
_OP = re.compile(r"\baten::[\w.]+")
#: what CUDA says when an operation inside a capture needs the host (a synchronization, a value
#: read back, a copy to or from pageable memory): a property of the model's code, not of a call's shapes
_NEEDS_HOST = ("operation not permitted when stream is capturing",
               "operation would make the legacy stream depend on a capturing blocking stream")
#: PyTorch code known to read a tensor on the host (matched in the failing line of PyTorch under
#: the script's, where the failure needs the host), and what keeps such a call capturable
_KNOWN_SYNCS = (
    (re.compile(r"_nested_tensor_from_mask"), "nn.TransformerEncoder's nested-tensor fast path reads the padding "
     "mask on the host: TransformerEncoder(..., enable_nested_tensor=False) keeps it capturable"),
)
#: the same, of the script's own failing line
_SCRIPT_SYNCS = (
    (re.compile(r"^\s*(?:el)?if\b|^\s*while\b"), "a Python branch on a tensor's value reads it on the host: "
     "computing both sides and choosing with torch.where keeps it capturable"),
    (re.compile(r"\.(?:item|tolist|cpu|numpy)\(\)"), "a value read back to the host inside forward: kept on the "
     "GPU (tensor arithmetic, torch.where) or read outside the model call, it is capturable"),
    (re.compile(r"\brepeat_interleave\("), "torch.repeat_interleave with a tensor of repeats sizes its output on the "
     "host: repeat_interleave(..., output_size=N) keeps it capturable"),
    (re.compile(r"\b(?:nonzero|masked_select|unique|unique_consecutive)\("), "an output whose size depends on the "
     "data is sized on the host: a fixed-size form (a mask multiplied in, torch.where) keeps it capturable"),
)
#: PyTorch functions that read an argument's values on the host, and what keeps such a model
#: capturable (named where a model uses a host argument inside one of them)
_HOST_READERS = {
    "pack_padded_sequence": "pack_padded_sequence packs by the lengths on the host, so no graph replays it for other "
    "lengths: for an RNN of one direction, the padded batch through the RNN and out[torch.arange(n), lengths - 1] "
    "(the lengths on the GPU) give each sequence's state after its last step and are capturable",
}


def torch_reader(depth: int = 2) -> tuple[str, str | None]:
    """Where PyTorch's own Python used a value on the host, seen from frame ``depth`` up: `` in
    PyTorch's NAME (torch/...py:line)`` of the PyTorch function the script's code called
    ("" where the script's code used it itself), and the way out where that function is known."""
    tdir = _torch_dir()
    f: Any = sys._getframe(depth)
    outer = None
    while f is not None and _skipped(f.f_code.co_filename):
        if tdir and os.path.abspath(f.f_code.co_filename).startswith(tdir):
            outer = f
        f = f.f_back
    if outer is None or f is None or not tdir:
        return "", None
    name = outer.f_code.co_name
    return f" in PyTorch's {name} ({_torch_shown(outer.f_code.co_filename)}:{outer.f_lineno})", _HOST_READERS.get(name)


def _end_broken_capture(stream: Any) -> None:
    try:
        from cuda.bindings import runtime as cudart

        err, status = cudart.cudaStreamIsCapturing(stream.cuda_stream)
        if int(err) == 0 and int(status) != int(cudart.cudaStreamCaptureStatus.cudaStreamCaptureStatusNone):
            cudart.cudaStreamEndCapture(stream.cuda_stream)
        cudart.cudaGetLastError()
    except Exception:  # noqa: BLE001 - best effort: the capture failed already, eager follows
        pass


def _fall_back(message: str, reason: str) -> None:
    """One line on stderr, and the reason among ``stats()["fallbacks"]``."""
    _log(message)
    _state["fallbacks"].append(reason)


def _debug_traceback() -> None:
    """The failure's traceback too, where ``RECSYS_DOCTOR_AUTOAPPLY_DEBUG`` asks for it."""
    if os.environ.get("RECSYS_DOCTOR_AUTOAPPLY_DEBUG"):
        import traceback

        traceback.print_exc()


def _synchronize_quietly(torch: Any) -> None:
    """Let the failed work drain before eager runs follow (a failure here changes nothing)."""
    try:
        torch.cuda.synchronize()
    except RuntimeError:  # a sticky CUDA error (torch.AcceleratorError is one): eager says it
        pass


def failure_reason(ex: BaseException) -> str:
    """Why a capture or a replay failed, for the log and the accounting: the exception's first
    line; where it was raised while handling an earlier one (a capture's end fails after an
    operation inside it did), the first line of the earliest raised through the script's own
    code; then the operator where their text names one (``aten::...``) and the line of the
    script's code (a model's ``forward``, not PyTorch's or the hook's) that exception was
    raised from, with that line's source."""
    chain = _chain(ex)
    root = next((c for c in reversed(chain) if _raised_at(c)), None)
    reason = _first_line(ex)
    if root is not None and root is not ex:
        reason += f"; first {_first_line(root)}"
    extra = []
    op = next((m.group(0) for c in chain if (m := _OP.search(str(c))) is not None), None)
    if op is not None and op not in reason:
        extra.append(op)
    if root is not None:
        extra.append(f"at {_raised_at(root)}")
        inner = _torch_frame(root)
        if inner is not None:
            extra.append(f"in {inner}")
        if needs_host(ex):
            for syncs, tb in ((_KNOWN_SYNCS, _innermost(root, script=False)), (_SCRIPT_SYNCS, _innermost(root, script=True))):
                extra += [hint for pat, hint in syncs if tb is not None and pat.search(_source(tb))]
    return f"{reason} ({'; '.join(extra)})" if extra else reason


def _innermost(ex: BaseException, script: bool) -> Any:
    """The innermost traceback entry of ``ex`` in the script's code (``script``), or in
    PyTorch's own Python below that one; None where there is none."""
    tb, last = ex.__traceback__, None
    tdir = None if script else _torch_dir()
    while tb is not None:
        fn = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not _skipped(fn):
            last = tb if script else None  # (not script: only PyTorch's frames below the script's count)
        elif tdir and fn.startswith(tdir):
            last = tb
        tb = tb.tb_next
    return last


def _torch_dir() -> str | None:
    torch_file = getattr(sys.modules.get("torch"), "__file__", None)
    return os.path.dirname(os.path.abspath(torch_file)) + os.sep if torch_file else None


def _where(tb: Any, shown: str) -> str:
    """``shown:line: source`` of traceback entry ``tb`` (its source cut at 60 characters)."""
    src = _source(tb).strip()
    if len(src) > 60:
        src = src[:57] + "..."
    return f"{shown}:{tb.tb_lineno}" + (f": {src}" if src else "")


def _source(tb: Any) -> str:
    return linecache.getline(tb.tb_frame.f_code.co_filename, tb.tb_lineno)


def needs_host(ex: BaseException) -> bool:
    """Whether a capture failed because an operation in it needs the host (CUDA refused it in a
    capture): the model's code does so whatever the call's shapes, so no capture of it can work."""
    return any(m in str(c) for c in _chain(ex) for m in _NEEDS_HOST)


def _chain(ex: BaseException) -> list[BaseException]:
    """``ex`` and the exceptions it was raised from or while handling, newest first (at most 8)."""
    chain = [ex]
    while len(chain) < 8:
        prev = chain[-1].__cause__ or chain[-1].__context__
        if prev is None or prev in chain:
            break
        chain.append(prev)
    return chain


def _torch_frame(ex: BaseException) -> str | None:
    """``torch/...py:line: source`` of the innermost frame of ``ex``'s traceback in PyTorch's
    own Python, below the script's innermost frame (the PyTorch call that raised), or None."""
    tb = _innermost(ex, script=False)
    return None if tb is None else _where(tb, _torch_shown(tb.tb_frame.f_code.co_filename))


def _torch_shown(filename: str) -> str:
    """A file of PyTorch's as ``torch/...py`` (relative to the folder holding torch/)."""
    return os.path.relpath(os.path.abspath(filename), os.path.dirname(os.path.dirname(_torch_dir() or "")))


def _raised_at(ex: BaseException) -> str | None:
    """``file:line: source`` of the innermost frame of ``ex``'s traceback in the script's code."""
    tb = _innermost(ex, script=True)
    return None if tb is None else _where(tb, _display(tb.tb_frame.f_code.co_filename))
