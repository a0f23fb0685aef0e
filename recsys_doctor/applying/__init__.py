"""Applying: run a chosen plan and measure it again - ``profile --apply`` (:mod:`.apply`, its
report :mod:`.report`), the plain-script hook (:mod:`.script_hook`, :mod:`._autoapply`) and the
training runner (:mod:`.train_runner`). Imports reports, history, capture, planning, runtime and below."""
