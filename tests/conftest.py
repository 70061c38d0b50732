"""Suite-wide: tests start from a clean rlfleet environment, whatever the developer's shell exports."""

import os

import pytest

import rlfleet  # noqa: F401  (before any test module imports grpc: sets GRPC_ENABLE_FORK_SUPPORT)

# mujoco picks its GL backend when it is first imported. rlfleet's MuJoCo modules set EGL before
# importing it, but one test process imports mujoco from many tests in varying order (a test that
# imports it first would otherwise leave a later in-process MetaWorld renderer aborting).
os.environ.setdefault("MUJOCO_GL", "egl")

_ROLE_VARIABLES = [k for k in os.environ if k.startswith("RLFLEET_") and k != "RLFLEET_LOG_LEVEL"]


@pytest.fixture(autouse=True)
def _no_rlfleet_environment(monkeypatch):
    """RLFLEET_TOKEN, RLFLEET_LEARNER, ... from the shell would change what roles and parsers do."""
    for key in _ROLE_VARIABLES:
        monkeypatch.delenv(key, raising=False)
