"""Fixtures for the integration tests; the helpers live in role_processes.py."""

from __future__ import annotations

import pytest
from role_processes import Roles


@pytest.fixture
def roles(tmp_path):
    r = Roles(tmp_path)
    yield r
    r.close()
