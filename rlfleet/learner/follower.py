"""A learner rank other than 0 under torchrun: it trains in lockstep and does nothing else.

It binds no port and writes no file: it builds the policy from the config and run spec rank 0 sends, then
runs the same PPO update on its share of each batch of segments rank 0 broadcasts, until rank 0
says the run is over. Checkpoints, TensorBoard, weight publishing and evaluation are rank 0's.
"""

from __future__ import annotations

import logging
import signal

import torch

from rlfleet.config import config_from_yaml
from rlfleet.learner.distributed import DDPRanks, Ranks
from rlfleet.learner.trainer import Trainer, ppo_config
from rlfleet.policies.checkpoint_io import policy_from_config, reference_policy

log = logging.getLogger(__name__)


def run_follower(ranks: Ranks) -> int:
    """Train until rank 0 stops; returns the number of updates taken part in."""
    if not isinstance(ranks, DDPRanks) or ranks.is_main:
        raise ValueError("only a torchrun rank other than 0 follows rank 0")
    # Ctrl-C or SIGTERM from torchrun: rank 0 finishes its update, checkpoints and tells us to stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    config_yaml, spec = ranks.receive_config()
    cfg = config_from_yaml(config_yaml)
    torch.manual_seed(cfg.runner.seed)
    # The architecture only: DDP replaces these weights with rank 0's at the first update.
    policy = policy_from_config(spec.policy, spec.state_dim, spec.action_dim, cfg.env.chunk_size, cfg.env.image_size)
    trainer = Trainer(
        policy,
        ppo_config(cfg.algorithm),
        cfg.learner.reward_scale,
        ranks.device(cfg.learner.device),
        ranks,
        reference=reference_policy(cfg, spec, policy),
        freeze_normalization=bool(spec.model_path),
    )
    updates = 0
    while (received := ranks.receive_update()) is not None:
        segments, version = received
        trainer.step(segments, version)
        updates += 1
    log.info("learner rank %d done: %d updates", ranks.rank, updates)
    return updates
