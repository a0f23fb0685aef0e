"""Planning: which plan to run - the advised plan from the findings (:mod:`.planner`), the
what-if model and search over candidate plans (:mod:`.whatif`, :mod:`.search`), plan files
(:mod:`.io`). Imports the analyzers' helpers, findings, the plan type, options, model, errors, _util."""
