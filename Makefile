# Two commands do everything on a fresh machine with only python3:
#   make demo   -> creates .venv, installs the package, diagnoses the shipped sample trace
#   make test   -> creates .venv, installs the package with test extras, runs the test suite
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test venv bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml setup.py recsys_doctor/loaders/_pagecodec.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/recsys-doctor advise --demo

test: $(STAMP)
	sh tests/ensure_chromium.sh
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) bench/scale_trace.py

clean:
	rm -rf $(VENV) build *.egg-info recsys_doctor/loaders/*.so
