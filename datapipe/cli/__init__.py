"""The `datapipe` command: main.py builds the parser and dispatches; one module a subcommand family.
May import every datapipe package; nothing in datapipe imports it (converters only lazily, from main)."""
from .main import main

__all__ = ["main"]
