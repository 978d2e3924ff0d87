"""The OpenAI-compatible HTTP API."""

from laneway.api.app import create_app

__all__ = ["create_app"]
