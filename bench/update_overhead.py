"""CPU per trained env step of the learner's PPO update against a bare CleanRL-style update of
the same network, settings and rows, alternated in one process.

The learner's update (`Trainer.step`: prepare the batch, epochs x minibatches of the clipped
objective, statistics, normalisation) runs on segments shaped like the ceiling bench's (the
Gaussian MLP 64x64 of `metaworld_reach_ppo` on a 39-float state, rollout 32, 4 minibatches, 5
epochs, `learner.batch_samples` rows). Beside it, the baseline is the update as CleanRL writes it
for continuous actions: GAE over the same rows, then for each epoch and minibatch one forward pass
of the same policy, ratio, clipped surrogate, value loss, entropy, backward, clip, Adam; nothing
else (no statistics, no lag mask, no importance weights). The ratio (learner / bare) is what the
learner's bookkeeping costs over the update's arithmetic; both are CPU seconds (process time), so
a busy machine moves it little. `--profile` prints the learner's top functions by own time.

    python bench/update_overhead.py                      # 2,048 rows, the ceiling bench's size
    python bench/update_overhead.py --rows 4096 --repeats 7 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np
import torch
from torch import nn

from rlfleet.algorithms import PPOConfig
from rlfleet.learner.trainer import Trainer
from rlfleet.policies.registry import make_policy
from rlfleet.wire.segment import Segment

S, D, T = 39, 4, 32


def _segment(policy: nn.Module, envs: int, version: int, rng: np.random.Generator) -> Segment:
    obs = {"states": rng.normal(size=(T, envs, S)).astype(np.float32)}
    with torch.no_grad():
        out = policy.act({"states": torch.from_numpy(obs["states"].reshape(T * envs, S))})
    done = rng.random((T, envs)) < 1 / 150
    return Segment(
        obs=obs,
        actions=out["actions"].numpy().reshape(T, envs, 1, D),
        logprobs=out["logprobs"].numpy().reshape(T, envs, *out["logprobs"].shape[1:]).astype(np.float32),
        values=out["values"].numpy().reshape(T, envs),
        rewards=rng.normal(size=(T, envs)).astype(np.float32),
        terminated=np.zeros((T, envs), bool),
        truncated=done,
        final_obs={"states": np.zeros_like(obs["states"])},
        next_obs={"states": obs["states"][-1]},
        versions=np.full(T, version, np.int64),
        task_ids=np.zeros(envs, np.int64),
        env_steps=np.array(T * envs, np.int64),
        ep_returns=np.zeros(0, np.float32),
        ep_lengths=np.zeros(0, np.int32),
        ep_success=np.zeros(0, bool),
        ep_task_ids=np.zeros(0, np.int64),
        extras={},
    )


class BareUpdate:
    """CleanRL's ppo_continuous_action update on the same policy (evaluate = log-prob, entropy,
    value) and rows: the arithmetic of an update with nothing around it."""

    def __init__(self, policy: nn.Module, cfg: PPOConfig) -> None:
        self.policy, self.cfg = policy, cfg
        self.opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr, eps=1e-5, fused=True)

    def step(self, segments: list[Segment]) -> None:
        cfg = self.cfg
        with torch.no_grad():
            obs = torch.cat([torch.from_numpy(s.obs["states"]).reshape(-1, S) for s in segments])
            actions = torch.cat([torch.from_numpy(s.actions).reshape(-1, 1, D) for s in segments])
            logp_old = torch.cat([torch.from_numpy(s.logprobs).reshape(-1, 1) for s in segments])
            rewards = torch.stack([torch.from_numpy(s.rewards) for s in segments], 1)  # [T, n, B]
            values = torch.stack([torch.from_numpy(s.values) for s in segments], 1)
            dones = torch.stack([torch.from_numpy(s.truncated).float() for s in segments], 1)
            adv = torch.zeros_like(rewards)
            last = torch.zeros_like(rewards[0])
            for t in reversed(range(T)):
                nv = values[t + 1] if t + 1 < T else values[t]
                delta = rewards[t] + cfg.gamma * nv * (1 - dones[t]) - values[t]
                last = delta + cfg.gamma * cfg.gae_lambda * (1 - dones[t]) * last
                adv[t] = last
            returns = (adv + values).permute(1, 0, 2).reshape(-1)
            adv = adv.permute(1, 0, 2).reshape(-1)
            values_old = values.permute(1, 0, 2).reshape(-1)
        n = len(obs)
        mb = n // cfg.num_minibatches
        for _ in range(cfg.update_epochs):
            order = torch.randperm(n)
            for i in range(0, n, mb):
                idx = order[i : i + mb]
                logp, entropy, v = self.policy.evaluate({"states": obs[idx]}, actions[idx], {})
                a = adv[idx]
                a = (a - a.mean()) / (a.std() + 1e-8)
                ratio = torch.exp(logp.reshape(len(idx), -1).sum(-1) - logp_old[idx].sum(-1))
                pg = torch.max(-a * ratio, -a * torch.clamp(ratio, 1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high))
                loss = pg.mean() + 0.5 * ((v - returns[idx]) ** 2).mean() - cfg.ent_coef * entropy.mean()
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
                self.opt.step()
        del values_old


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=2048, help="rows per update (learner.batch_samples)")
    p.add_argument("--envs", type=int, default=16, help="envs per segment")
    p.add_argument("--repeats", type=int, default=5, help="alternating pairs of updates; medians are reported")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--profile", action="store_true", help="also profile the learner's updates")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    settings = {"name": "gaussian_mlp", "hidden_sizes": [64, 64]}
    cfg = PPOConfig(update_epochs=5, num_minibatches=4, lr=3e-4, value_clip=None, max_policy_lag=2)
    learner_policy = make_policy(settings, S, D, 1)
    bare_policy = make_policy(settings, S, D, 1)
    bare_policy.load_state_dict(learner_policy.state_dict())
    trainer, bare = Trainer(learner_policy, cfg), BareUpdate(bare_policy, cfg)
    rng = np.random.default_rng(0)
    version = 3
    segments = [_segment(learner_policy, args.envs, version - 1, rng) for _ in range(args.rows // (T * args.envs))]
    rows = sum(s.num_steps * s.num_envs for s in segments)
    trainer.step(segments, version)  # warm-up
    bare.step(segments)
    seconds: dict[str, list[float]] = {"learner": [], "bare": []}
    for _ in range(args.repeats):
        for name, run in (("learner", lambda: trainer.step(segments, version)), ("bare", lambda: bare.step(segments))):
            t = time.process_time()
            run()
            seconds[name].append(time.process_time() - t)
    med = {k: float(np.median(v)) for k, v in seconds.items()}
    for k, v in seconds.items():
        runs = " ".join(f"{x:.3f}" for x in v)
        print(f"{k:8s} {1e6 * med[k] / rows:6.1f} us per trained env step  (CPU s per update: {runs})")
    shape = f"{rows} rows, {cfg.update_epochs} epochs x {cfg.num_minibatches} minibatches"
    print(f"learner / bare: {med['learner'] / med['bare']:.2f}  ({shape})")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.repeats):
            trainer.step(segments, version)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
