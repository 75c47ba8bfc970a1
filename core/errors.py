"""The errors every layer raises and the command line and the API answer alike."""

from __future__ import annotations


class UsageError(Exception):
    """A request abwatch cannot carry out as asked — a bad config value, an unknown ref, a
    record that does not validate, a device that is not there — and whose message names what
    is at fault. The command line answers every one with that message and exit status 2."""
