"""An engine's launch: a command template that cannot be filled in fails the launch
(``LaunchFailed``, which the fleet turns into a 503 ``model_unavailable`` and a back-off),
never an exception that ends the fleet's task."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from laneway.config.fleet import EngineLaunch
from laneway.runtime.launcher import EngineProcess, LaunchFailed


@pytest.mark.parametrize("arg", ["{port:d}", "{port!x}", "{port.real}", "{nope}"])
def test_a_template_that_cannot_be_filled_in_fails_the_launch(tmp_path: Path, arg: str) -> None:
    engine = EngineProcess("m#1", "m", EngineLaunch(("serve", "--port", arg)), (0,), tmp_path)
    with pytest.raises(LaunchFailed, match="its command cannot be filled in"):
        asyncio.run(engine.start())
    assert engine.proc is None  # (nothing was started)
