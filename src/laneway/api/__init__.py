"""The OpenAI-compatible HTTP API.

``create_app`` is imported on first use, so that modules which only need the
request parsing (``laneway.api.params``, used by batch validation) do not pull
in the whole application and its imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from laneway.api.app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from laneway.api.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
