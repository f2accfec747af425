"""The package's version, in a module of its own so that code inside the package (the wheel
that ships skyward to workers) reads it without importing the ``skyward`` package itself."""

__version__ = "0.1.0"
