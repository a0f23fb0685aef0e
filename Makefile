# Two commands do everything on a fresh machine with only python3:
#   make demo   -> creates .venv, installs the package, diagnoses the shipped sample trace
#   make lint   -> ruff (lint rules in pyproject.toml) and mypy (.ci/typecheck.py: the installed
#                  package names recsys_doctor, .analyzers, .runtime, .reports)
#   make test   -> creates .venv, installs the package with test extras, runs the test suite;
#                  as root with apt-get and no /usr/bin/chromium it first installs Debian's
#                  chromium package for the HTML report test (tests/ensure_chromium.sh).
#                  make test NO_CHROMIUM=1 (or RECSYS_DOCTOR_NO_CHROMIUM=1): install nothing
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
NO_CHROMIUM ?= $(RECSYS_DOCTOR_NO_CHROMIUM)

.PHONY: demo lint test venv bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py recsys_doctor/loaders/_pagecodec.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/recsys-doctor advise --demo

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) .ci/typecheck.py

test: $(STAMP)
	RECSYS_DOCTOR_NO_CHROMIUM="$(NO_CHROMIUM)" sh tests/ensure_chromium.sh
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/scale/scale_trace.py

clean:
	rm -rf $(VENV) build *.egg-info recsys_doctor/loaders/*.so .mypy_cache .ruff_cache
