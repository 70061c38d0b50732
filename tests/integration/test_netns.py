"""Roles on separate network namespaces joined by a veth pair: the fleet across "hosts".

The learner and the inference server live in one namespace and bind its veth address (not
loopback, so a token is required); the actor lives in another and reaches both across the
link. The addresses are private to the test's namespaces: nothing leaves this machine.
Needs root and iproute2 (CI runs as root); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys

import pytest
from role_processes import TINY, Roles


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _namespaces_or_skip(tag: str) -> tuple[str, str]:
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (`ip`) is not installed")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (CI runs as root)")
    a, b = f"rlf{tag}a", f"rlf{tag}b"
    try:
        _ip("netns", "add", a)
    except subprocess.CalledProcessError as exc:
        pytest.skip(f"cannot create a network namespace here: {exc.stderr.strip()}")
    _ip("netns", "add", b)
    return a, b


class NamespacedRoles(Roles):
    """Roles whose processes start inside a network namespace."""

    def start_in(self, ns: str, name: str, *args: str, env: dict[str, str]) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")
        cmd = ["ip", "netns", "exec", ns, sys.executable, "-m", "rlfleet.cli", *args]
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(os.environ, OMP_NUM_THREADS="1", **env),
        )
        self.procs.append(proc)
        return proc


@pytest.fixture
def two_hosts(tmp_path):
    tag = f"{os.getpid() % 100000}"
    a, b = _namespaces_or_skip(tag)
    va, vb = f"rlf{tag}x", f"rlf{tag}y"
    net = 100 + os.getpid() % 100
    addr_a, addr_b = f"10.231.{net}.1", f"10.231.{net}.2"
    try:
        _ip("link", "add", va, "type", "veth", "peer", "name", vb)
        _ip("link", "set", va, "netns", a)
        _ip("link", "set", vb, "netns", b)
        for ns, dev, addr in ((a, va, addr_a), (b, vb, addr_b)):
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        roles = NamespacedRoles(tmp_path)
        yield roles, (a, addr_a), (b, addr_b)
        roles.close()
    finally:
        for ns in (a, b):  # deleting a namespace removes its end of the veth pair, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_fleet_across_namespaces_trains(two_hosts, tmp_path):
    roles, (ns_a, addr_a), (ns_b, addr_b) = two_hosts
    env = {"RLFLEET_TOKEN": secrets.token_hex(16)}
    run = tmp_path / "run"
    learner = roles.start_in(
        ns_a,
        "learner",
        "learner",
        "metaworld_reach_ppo",
        *TINY,
        "runner.total_env_steps=640",
        f"runner.logger.log_path={run}",
        "--host",
        addr_a,
        "--address-file",
        str(tmp_path / "learner.json"),
        env=env,
    )
    laddr = roles.wait_address("learner", learner)["learner"]
    assert laddr.startswith(addr_a)
    inference = roles.start_in(
        ns_a,
        "inference",
        "inference",
        "--learner",
        laddr,
        "--host",
        addr_a,
        "--address-file",
        str(tmp_path / "inference.json"),
        env=env,
    )
    iaddr = roles.wait_address("inference", inference)["inference"]
    assert iaddr.startswith(addr_a)
    # the actor is on the other "host": it reaches both roles only through the veth link
    actor = roles.start_in(
        ns_b,
        "actor",
        "actor",
        "--learner",
        laddr,
        "--inference",
        iaddr,
        "--transport",
        "zmq",
        "--id",
        "actor-b",
        env=env,
    )
    assert roles.wait(learner, "learner", 300) == 0, roles.log("learner")[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] >= 640 and summary["updates"] >= 3, summary
    assert summary["segments_by_client"].get("actor-b", 0) > 0, summary
    for name, proc in (("inference", inference), ("actor", actor)):
        assert roles.wait(proc, name, 60) == 0, roles.log(name)[-3000:]


def test_actor_without_the_token_is_refused_across_namespaces(two_hosts, tmp_path):
    roles, (ns_a, addr_a), (ns_b, _) = two_hosts
    run = tmp_path / "run"
    learner = roles.start_in(
        ns_a,
        "learner",
        "learner",
        "metaworld_reach_ppo",
        *TINY,
        "runner.total_env_steps=100000",
        f"runner.logger.log_path={run}",
        "--host",
        addr_a,
        "--address-file",
        str(tmp_path / "learner.json"),
        env={"RLFLEET_TOKEN": "right-token"},
    )
    laddr = roles.wait_address("learner", learner)["learner"]
    actor = roles.start_in(
        ns_b,
        "actor",
        "actor",
        "--learner",
        laddr,
        "--inference",
        laddr,
        "--id",
        "intruder",
        env={"RLFLEET_TOKEN": "wrong-token"},
    )
    assert roles.wait(actor, "actor", 120) != 0
    assert "UNAUTHENTICATED" in roles.log("actor") or "token" in roles.log("actor").lower(), roles.log("actor")[-2000:]
