"""The base of failures a user can cause and fix (bad data, bad options): the CLI prints their
message as one line and exits non-zero, without a traceback. Kept free of heavy imports."""


class ExpectedError(Exception):
    """An expected failure whose message says what went wrong and what to do."""
