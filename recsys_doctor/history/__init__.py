"""History: every run's result kept in one SQLite file (:mod:`.db`), one row per run
(:mod:`.row`). Imports diagnose (the result it stores), options, errors, _util."""
