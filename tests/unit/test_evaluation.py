"""Evaluation sees the same episodes however many envs run at once."""

from __future__ import annotations

import torch

from rlfleet.envs.api import EnvConfig
from rlfleet.eval.episodes import evaluate_policy
from rlfleet.policies import GaussianMLPPolicy, PolicyConfig


def test_rounds_of_envs_give_the_same_result_as_one_batch():
    torch.manual_seed(0)
    policy = GaussianMLPPolicy(39, 4, 1, PolicyConfig(hidden_sizes=[16]))
    with torch.no_grad():
        for p in policy.actor.parameters():
            p.normal_(0.0, 1.0)  # a policy that reaches some goals and misses others
    cfg = EnvConfig(task="reach-v3,drawer-close-v3", max_episode_steps=40)
    one = evaluate_policy(policy, cfg, 6, max_envs=100)
    rounds = evaluate_policy(policy, cfg, 6, max_envs=4)  # 3 rounds of 2 episodes per task
    assert one == rounds
    assert set(one) == {"reach-v3", "drawer-close-v3"}
    assert all(v in {k / 6 for k in range(7)} for v in one.values())


def test_rounds_reuse_one_env_batch_and_close_it(monkeypatch):
    """A new 50-env batch per round held ~2 GB each in the process: rounds of one size share one batch."""
    import rlfleet.eval.episodes as evaluation

    made, closed = [], []
    real_make_env = evaluation.make_env

    def counting_make_env(cfg, n):
        env = real_make_env(cfg, n)
        made.append(n)
        real_close = env.close
        env.close = lambda: (closed.append(n), real_close())
        return env

    monkeypatch.setattr(evaluation, "make_env", counting_make_env)
    policy = GaussianMLPPolicy(39, 4, 1, PolicyConfig(hidden_sizes=[16]))
    cfg = EnvConfig(task="reach-v3,drawer-close-v3", max_episode_steps=10)
    result = evaluate_policy(policy, cfg, 5, max_envs=4)  # rounds of 2, 2, 1 episodes per task
    assert made == [4, 2] and sorted(closed) == [2, 4]
    assert result == evaluate_policy(policy, cfg, 5, max_envs=100)


def test_rlfleet_eval_plays_the_validation_split_apart_from_the_test_one(tmp_path, capsys):
    """`rlfleet eval CKPT --split validation`: the validation seeds (eval.validation_seed up), in
    its own report folder, eval.json saying which split; the default stays the test split."""
    import dataclasses
    import json

    from rlfleet.cli import main
    from rlfleet.eval.paired import read_episodes
    from rlfleet.policies.checkpoint_io import model_config, save_checkpoint_folder

    policy = GaussianMLPPolicy(39, 4, 1, PolicyConfig(hidden_sizes=[16]))
    env = dataclasses.asdict(EnvConfig(task="reach-v3", max_episode_steps=5))
    evaluation = {"task": "", "seed": 10_000, "validation_seed": 600_000, "episodes_per_task": 2}
    ckpt = tmp_path / "ckpt"
    save_checkpoint_folder(
        ckpt, policy, model_config({"name": "gaussian_mlp", "hidden_sizes": [16]}, 39, 4, 1, env, 0, evaluation)
    )
    assert main(["eval", str(ckpt)]) == 0
    assert main(["eval", str(ckpt), "--split", "validation"]) == 0
    test, val = read_episodes(ckpt / "eval"), read_episodes(ckpt / "eval_validation")
    assert [r["seed"] for r in test] == [10_000, 10_001] and [r["seed"] for r in val] == [600_000, 600_001]
    assert json.loads((ckpt / "eval" / "eval.json").read_text())["split"] == "test"
    assert json.loads((ckpt / "eval_validation" / "eval.json").read_text())["split"] == "validation"
    assert "held-out split: validation (episode seeds from 600000)" in capsys.readouterr().out
