"""Suite-wide: tests start from a clean rlfleet environment, whatever the developer's shell exports."""

import os

import pytest

import rlfleet  # noqa: F401  (before any test module imports grpc: sets GRPC_ENABLE_FORK_SUPPORT)

_ROLE_VARIABLES = [k for k in os.environ if k.startswith("RLFLEET_") and k != "RLFLEET_LOG_LEVEL"]


@pytest.fixture(autouse=True)
def _no_rlfleet_environment(monkeypatch):
    """RLFLEET_TOKEN, RLFLEET_LEARNER, ... from the shell would change what roles and parsers do."""
    for key in _ROLE_VARIABLES:
        monkeypatch.delenv(key, raising=False)
