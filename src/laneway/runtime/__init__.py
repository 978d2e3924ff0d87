"""The asyncio runtime: feeds events to the core and applies its decisions to workers."""

from laneway.runtime.runtime import Runtime
from laneway.runtime.ticket import Phase, Ticket

__all__ = ["Phase", "Runtime", "Ticket"]
