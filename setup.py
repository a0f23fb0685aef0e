"""Only the compiled part of the build; everything else is in pyproject.toml.

``_pagecodec`` is the SQLite page reader's row loop in C (README "The page reader"). It is
optional: where no C compiler is at hand the install still succeeds and the page reader
runs its numpy path, which gives the same tables, more slowly."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("recsys_doctor.loaders._pagecodec", ["recsys_doctor/loaders/_pagecodec.c"],
                             extra_compile_args=["-O2", "-std=c99"], optional=True)])
