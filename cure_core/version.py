"""The package's version: one module with no imports, so anything may read it (trace headers, the package face)."""
__version__ = "0.1.0"
