"""The compose package's error (its own module: ``runtime`` and ``tbbmode`` both raise it)."""


class ComposeError(RuntimeError):
    """A compose mode that cannot run here; the message says what was found."""
