"""GradScope's release, apart so that the recording writer can name it without importing
the package (whose ``watch`` imports the engine)."""

__version__ = "0.1.0"
