"""Evaluation sees the same episodes however many envs run at once."""
from __future__ import annotations

import torch

from rlfleet.envs.api import EnvConfig
from rlfleet.evaluation import evaluate_policy
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
