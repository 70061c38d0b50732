"""What the learner learns at start travels as the run spec over a real LearnerService: a role
that registers gets the spec and the user's composed config, unchanged; a resumed learner's spec
carries its checkpoint's env steps, and a real actor's envs start the episode stream they name."""

from __future__ import annotations

import json

import yaml
from role_processes import TINY

from rlfleet.config import as_dict, load_config, to_yaml
from rlfleet.envs.core import training_stream
from rlfleet.envs.registry import build_env_config
from rlfleet.envs.run_shapes import probe_env_dims, run_slot_layout
from rlfleet.learner.main import Learner
from rlfleet.wire.join import register
from rlfleet.wire.run_spec import read_run_spec, registered_spec


def _overrides(run) -> list[str]:
    return [*TINY, f"runner.logger.log_path={run}"]


def test_a_registering_actor_gets_the_run_spec_and_the_users_config_as_composed(tmp_path):
    run = tmp_path / "run"
    composed = load_config("metaworld_reach_ppo", _overrides(run))
    learner = Learner(load_config("metaworld_reach_ppo", _overrides(run)), run)
    try:
        address = learner.start()
        reply = register(address, "actor-a", "actor", timeout_s=30)
        assert reply.config_yaml == to_yaml(composed) == (run / "config.yaml").read_text()
        served = yaml.safe_load(reply.config_yaml)
        assert "model_dims" not in served and "resumed_from_env_steps" not in served["runner"]
        assert served["policy"] == as_dict(composed.policy) == {"name": "gaussian_mlp", "hidden_sizes": [32, 32]}
        spec = registered_spec(reply, address)
        assert spec == learner.spec == read_run_spec(run)
        env = build_env_config(as_dict(composed.env))
        assert (spec.state_dim, spec.action_dim) == probe_env_dims(env)
        assert spec.resumed_from_env_steps == 0 and spec.model_path == ""
        # the settings the learner built its policy with: the user's and the policy's defaults
        assert spec.policy["hidden_sizes"] == [32, 32] and set(spec.policy) > set(served["policy"])
        layout = run_slot_layout(env, spec, 4)  # an actor's slots, sized from the spec alone
        assert layout["states"].shape == (4, spec.state_dim)
        assert layout["actions"].shape == (4, env.chunk_size, spec.action_dim)
    finally:
        learner.servicer.stop_event.set()
        learner.close()


def test_a_resumed_learners_spec_carries_its_checkpoint_and_a_real_actor_follows_it(roles, tmp_path):
    run = tmp_path / "run"
    first = Learner(load_config("metaworld_reach_ppo", _overrides(run)), run)
    first.counters.env_steps = 640  # as if its first life had trained this far
    first.save()
    first.close()

    resumed_cfg = load_config("metaworld_reach_ppo", [*_overrides(run), "runner.resume=true"])
    resumed = Learner(resumed_cfg, run)
    try:
        address = resumed.start()
        reply = register(address, "actor-probe", "actor", timeout_s=30)
        assert registered_spec(reply, address).resumed_from_env_steps == 640
        assert "resumed_from_env_steps" not in yaml.safe_load(reply.config_yaml)["runner"]
        assert reply.config_yaml == to_yaml(resumed_cfg)  # the user's config, resume=true and all
    finally:
        resumed.servicer.stop_event.set()
        resumed.close()

    # a real fleet resumes from the same checkpoint: its actor's envs start the spec's stream
    learner, laddr = roles.learner(run, "runner.total_env_steps=1280", "eval.at_end=false", resume=True)
    _, iaddr = roles.inference(laddr)
    actor = roles.actor("actor-again", laddr, iaddr, "shm")
    assert roles.wait(learner, "learner", 240) == 0, roles.log("learner")[-3000:]
    assert roles.wait(actor, "actor-again", 60) == 0, roles.log("actor-again")[-3000:]
    assert json.loads((run / "run_spec.json").read_text())["resumed_from_env_steps"] == 640
    stream = training_stream(640, 0)
    assert f"its envs start training episode stream {stream} (restart 0)" in roles.log("actor-again")
