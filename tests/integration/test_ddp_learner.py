"""`torchrun --nproc-per-node 2 -m rlfleet.learner` in a fleet: rank 0 serves, both ranks train."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

from role_processes import TINY


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_torchrun_learner_with_two_gloo_ranks_trains_and_rank0_checkpoints(roles, tmp_path):
    run = tmp_path / "run"
    address_file = tmp_path / "learner.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{_free_port()}",
        "-m",
        "rlfleet.learner",
        "metaworld_reach_ppo",
        *TINY,
        f"runner.logger.log_path={run}",
        "runner.total_env_steps=256",
        "eval.at_end=false",
        "learner.distributed.backend=gloo",
        "--address-file",
        str(address_file),
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    with open(tmp_path / "learner.log", "ab") as log:
        learner = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    roles.procs.append(learner)  # cleaned up with the other roles
    laddr = roles.wait_address("learner", learner, timeout=180)["learner"]
    _, iaddr = roles.inference(laddr)
    actor = roles.actor("actor-0", laddr, iaddr, "shm")

    assert roles.wait(learner, "learner", 300) == 0, roles.log("learner")[-4000:]
    text = roles.log("learner")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["updates"] >= 3 and summary["env_steps"] >= 256
    assert (run / "checkpoints" / "latest").read_text().startswith("update_")
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    # both ranks joined, one of them served, and rank 1 took part in every update
    assert "learner rank 0 of 2 on host" in text and "learner rank 1 of 2 on host" in text
    assert len(re.findall(r"learner listening on", text)) == 1
    follower = re.search(r"learner rank 1 done: (\d+) updates", text)
    assert follower and int(follower.group(1)) == summary["updates"], text[-4000:]
    assert roles.wait(actor, "actor-0", 60) == 0, roles.log("actor-0")[-3000:]
