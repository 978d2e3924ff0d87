"""The core and the cluster's remote scheduler both implement the runtime's scheduler
surface (:class:`laneway.runtime.scheduling.SchedulerPort`), with the same signatures."""

from __future__ import annotations

import inspect

import pytest

from laneway.cluster.remote import RemoteScheduler
from laneway.core import Scheduler
from laneway.runtime.scheduling import SchedulerPort

MEMBERS = sorted(
    name
    for name, v in vars(SchedulerPort).items()
    if not name.startswith("_") and (callable(v) or isinstance(v, property))
)


def params(fn: object) -> list[tuple[str, object, object]]:
    sig = inspect.signature(fn)  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def test_the_port_names_what_the_runtime_calls() -> None:
    assert {"submit", "finished", "preempted", "cancel", "schedule", "estimate_wait", "queued"} <= set(
        MEMBERS
    )


@pytest.mark.parametrize("impl", [Scheduler, RemoteScheduler], ids=["core", "remote"])
@pytest.mark.parametrize("name", MEMBERS)
def test_each_implementation_has_the_member_with_its_signature(impl: type, name: str) -> None:
    want = inspect.getattr_static(SchedulerPort, name)
    got = inspect.getattr_static(impl, name, None)
    if got is None:  # (the core's methods live on its mixins)
        got = getattr(impl, name, None)
    assert got is not None, f"{impl.__name__} has no {name}"
    if isinstance(want, property):
        assert isinstance(got, property), f"{impl.__name__}.{name} is not a property"
        return
    assert params(getattr(impl, name)) == params(want), f"{impl.__name__}.{name}"
