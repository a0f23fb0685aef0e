"""Diagnose: a trace in, an :class:`~.advise.AdviseResult` out - the analyzers run over it,
the findings sorted, the verdict and the advised plan (:mod:`.advise`), and across ranks (:mod:`.ranks`).
Imports planning, the analyzers, loaders, findings, options, model, errors, _util."""
