"""Helpers every stage shares: files and hashing, forking a second process, number
formats, JSON, process set-up, progress bars, the version. Imports only :mod:`recsys_doctor.errors`."""

#: the package's version (``recsys_doctor.__version__``): here, at the bottom, so that a
#: stage can name it without importing the package's public face
__version__ = "0.1.0"
