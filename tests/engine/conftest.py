"""Fixtures for the engine tests: the built-in tiny model, loaded once."""

from __future__ import annotations

from pathlib import Path

import pytest

from laneway.engine.engine import Engine
from laneway.engine.models import LoadedModel, load_model


@pytest.fixture(scope="session")
def tiny() -> LoadedModel:
    return load_model("builtin:tiny", "cpu")


@pytest.fixture
def engine(tiny: LoadedModel, tmp_path: Path) -> Engine:
    return Engine(tiny, slots=4, data_dir=tmp_path)
