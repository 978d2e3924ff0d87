"""The exception tree of the policy core.

Everything the core raises derives from :class:`LanewayError`, so callers at a
boundary (CLI, HTTP) can translate it into a clean message.
"""

from __future__ import annotations


class LanewayError(Exception):
    """Base class of every error laneway raises on purpose."""


class ConfigError(LanewayError, ValueError):
    """A configuration value is invalid; the message names the key."""


class InvalidTransition(LanewayError):
    """A request was asked to move between two lifecycle states that are not linked."""


class UnknownRequest(LanewayError, KeyError):
    """An event named a request the scheduler does not hold."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message plain
        return str(self.args[0]) if self.args else "unknown request"
