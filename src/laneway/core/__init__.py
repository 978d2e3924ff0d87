"""The pure policy core: events and a clock value in, decisions out.

Nothing in this package does I/O, uses asyncio or imports torch; the
simulator and the server drive the same :class:`Scheduler`.
"""

from laneway.core.admission import Quota, TenantPolicy
from laneway.core.classes import ClassTable, PriorityClass
from laneway.core.config import SchedulerConfig
from laneway.core.costs import CostModel
from laneway.core.decisions import (
    Decision,
    Dispatch,
    Evict,
    Load,
    LoadAdapter,
    Preempt,
    Reject,
    UnloadAdapter,
)
from laneway.core.errors import ConfigError, InvalidTransition, LanewayError, UnknownRequest
from laneway.core.gpu_placement import GpuPlacement
from laneway.core.inventory import GpuSpec, Inventory, ModelSpec
from laneway.core.measures import WaitRange
from laneway.core.modes import PreemptionMode, StopMode
from laneway.core.policies import POLICIES, PolicySpec
from laneway.core.request import TERMINAL, TRANSITIONS, Request, State
from laneway.core.scheduler import Scheduler
from laneway.core.workers import WorkerSpec

__all__ = [
    "POLICIES",
    "TERMINAL",
    "TRANSITIONS",
    "ClassTable",
    "ConfigError",
    "CostModel",
    "Decision",
    "Dispatch",
    "Evict",
    "GpuPlacement",
    "GpuSpec",
    "InvalidTransition",
    "Inventory",
    "LanewayError",
    "Load",
    "LoadAdapter",
    "ModelSpec",
    "PolicySpec",
    "Preempt",
    "PreemptionMode",
    "PriorityClass",
    "Quota",
    "Reject",
    "Request",
    "Scheduler",
    "SchedulerConfig",
    "State",
    "StopMode",
    "TenantPolicy",
    "UnknownRequest",
    "UnloadAdapter",
    "WaitRange",
    "WorkerSpec",
]
