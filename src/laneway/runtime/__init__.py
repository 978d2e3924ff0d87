"""The asyncio runtime: feeds events to the core and applies its decisions to workers."""

from laneway.runtime.runtime import Runtime
from laneway.runtime.ticket import Phase, Ticket
from laneway.runtime.workers import CHECKPOINTS, build_workers

__all__ = ["CHECKPOINTS", "Phase", "Runtime", "Ticket", "build_workers"]
