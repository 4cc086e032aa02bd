from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.providers.standin import StandInServer


@pytest.fixture
def standin() -> Iterator[StandInServer]:
    with StandInServer() as srv:
        yield srv
