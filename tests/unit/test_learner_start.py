"""Constructing a Learner builds its policy, trainer and servicer but opens no port; start() serves."""

import grpc

from rlfleet.config import load_config
from rlfleet.learner.main import Learner


def test_learner_starts_nothing_until_start(tmp_path):
    cfg = load_config(
        "metaworld_reach_ppo", [f"runner.logger.log_path={tmp_path}", "actor.num_envs=4", "learner.batch_env_steps=64"]
    )
    learner = Learner(cfg, tmp_path)
    try:
        assert learner.server is None and learner.address == "" and learner.port == 0
        assert (tmp_path / "config.yaml").exists()  # the run folder is ready before anything serves
        address = learner.start()
        assert address == learner.address and address.startswith("127.0.0.1:") and learner.port > 0
        assert learner.start() == address  # idempotent: one server
        with grpc.insecure_channel(address) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)
    finally:
        learner.servicer.stop_event.set()
        learner.close()


def test_close_without_start_is_fine(tmp_path):
    cfg = load_config("metaworld_reach_ppo", [f"runner.logger.log_path={tmp_path}", "actor.num_envs=4"])
    learner = Learner(cfg, tmp_path)
    learner.close()
    assert learner.server is None
