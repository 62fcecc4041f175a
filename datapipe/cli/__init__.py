"""The `datapipe` command: main.py builds the parser from one module a subcommand and runs one; flags.py,
mix.py and recipe.py hold what several share. May import every datapipe package; nothing in datapipe
imports it (converters only lazily, from convert.py)."""
from .main import main

__all__ = ["main"]
