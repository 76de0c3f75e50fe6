"""One exception type for every bad input the project refuses."""


class TQError(ValueError):
    """A clear, user-facing error: the message names the problem and what to do about it."""
