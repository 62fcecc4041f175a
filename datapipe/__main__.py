"""`python -m datapipe ...` is the `datapipe` command."""
from .cli import main

raise SystemExit(main())
