"""gputui: watch, run and release jobs on rented GPU hosts."""

__version__ = "0.1.0"
