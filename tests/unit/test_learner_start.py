"""Constructing a Learner builds its policy, trainer and servicer but opens no port; start() serves."""

import grpc

from rlfleet.config import load_config
from rlfleet.envs.registry import build_env_config
from rlfleet.learner.main import Learner


def test_learner_starts_nothing_until_start(tmp_path):
    cfg = load_config(
        "metaworld_reach_ppo", [f"runner.logger.log_path={tmp_path}", "actor.num_envs=4", "learner.batch_samples=64"]
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


def test_the_run_spec_it_serves_holds_the_settings_of_the_checkpoint_it_started_from(tmp_path):
    """RL from a checkpoint whose settings the recipe does not name (here activation and
    init_log_std): inference servers and DDP ranks build their copy from the run spec the
    learner serves, so it carries the checkpoint's settings, as the learner's policy has them;
    the config it serves (and config.yaml) stays the user's, without them."""
    from rlfleet.config import config_from_yaml
    from rlfleet.envs.run_shapes import probe_env_dims
    from rlfleet.policies.checkpoint_io import model_config, save_checkpoint_folder
    from rlfleet.policies.registry import make_policy
    from rlfleet.wire.run_spec import RunSpec, read_run_spec

    overrides = [f"runner.logger.log_path={tmp_path / 'run'}", "actor.num_envs=4"]
    cfg = load_config("metaworld_reach_ppo", overrides)
    state_dim, action_dim = probe_env_dims(build_env_config(cfg.env))
    sft = {"name": "gaussian_mlp", "hidden_sizes": [64, 64], "activation": "relu", "init_log_std": -1.5}
    save_checkpoint_folder(
        tmp_path / "sft",
        make_policy(sft, state_dim, action_dim, 1),
        model_config(sft, state_dim, action_dim, 1),
    )
    cfg = load_config("metaworld_reach_ppo", [*overrides, f"policy.model_path={tmp_path / 'sft'}"])
    learner = Learner(cfg, tmp_path / "run")
    try:
        spec = RunSpec.from_proto(learner.servicer.run_spec)
        assert (spec.state_dim, spec.action_dim) == (state_dim, action_dim)
        assert spec.policy["activation"] == "relu" and spec.model_path == str(tmp_path / "sft")
        copy = make_policy(spec.fresh_policy_settings(), state_dim, action_dim, 1)  # what an inference server builds
        assert copy.cfg == learner.policy.cfg
        assert learner.model_config["policy"]["activation"] == "relu"
        assert read_run_spec(tmp_path / "run") == spec  # run_spec.json beside config.yaml
        served = config_from_yaml(learner.servicer.config_yaml)
        assert "activation" not in served.policy and served.policy.model_path == str(tmp_path / "sft")
        assert learner.servicer.config_yaml == (tmp_path / "run" / "config.yaml").read_text()
    finally:
        learner.close()


def test_resume_without_a_checkpoint_starts_fresh_with_one_warning(tmp_path, caplog):
    """`--resume` on a folder without a checkpoint says it starts fresh, and nothing about the
    losses of a resume that did not happen."""
    cfg = load_config(
        "metaworld_reach_ppo", [f"runner.logger.log_path={tmp_path}", "actor.num_envs=4", "runner.resume=true"]
    )
    with caplog.at_level("WARNING", logger="rlfleet"):
        learner = Learner(cfg, tmp_path)
    learner.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "no checkpoint under" in warnings[0] and "starting fresh" in warnings[0]
    assert learner.counters.env_steps == 0 and learner.losses.accepted == 0


def test_a_ppo_run_whose_episode_is_not_a_whole_number_of_chunks_starts(tmp_path):
    """GRPO's whole-episode rule (max_episode_steps a multiple of chunk_size) is GRPO's alone: a PPO
    learner with 150-step episodes and chunks of 4 starts."""
    cfg = load_config("metaworld_reach_ppo", [f"runner.logger.log_path={tmp_path}", "env.chunk_size=4"])
    assert cfg.env.max_episode_steps % cfg.env.chunk_size
    Learner(cfg, tmp_path).close()


def test_the_learner_counts_actor_lives_that_never_reported_from_their_ledger_files(tmp_path):
    """An actor still reconnecting when the run ends (or killed before its report) leaves its
    account in RUN/ledgers: the learner counts it at the end and at resume, once."""
    from rlfleet.wire.life_ledger import RECORD, ledger_path

    cfg = load_config("metaworld_reach_ppo", [f"runner.logger.log_path={tmp_path}", "actor.num_envs=4"])
    learner = Learner(cfg, tmp_path)
    try:
        folder = tmp_path / "ledgers"
        folder.mkdir()
        ledger_path(folder, "actor0", 0xABCD).write_bytes(RECORD.pack(512, 0, 0))  # taken, accepted, rejected
        poisoned = ledger_path(folder, "actor1", 0x1234)
        poisoned.write_bytes(RECORD.pack(1 << 62, 0, 0))
        assert learner.count_unreported_lives() == 512
        assert learner.losses.by_cause() == {"actor_crashed": 512}
        assert (folder / "actor0.0000abcd.reported").exists() and poisoned.exists()  # refused: left, not counted
        assert learner.count_unreported_lives() == 0  # once
    finally:
        learner.close()


def test_the_learner_end_sweep_meets_an_actor_renaming_its_own_ledger(tmp_path, monkeypatch):
    """At the end of a run the actor's report and the learner's sweep of RUN/ledgers race for the
    same file: the actor may rename it `.reported` between the learner's listing and its rename, or
    before its read. Neither is an error (the learner ignores a repeated report)."""
    import rlfleet.learner.main as learner_main
    from rlfleet.wire.life_ledger import RECORD, ledger_path, read_account

    cfg = load_config("metaworld_reach_ppo", [f"runner.logger.log_path={tmp_path}", "actor.num_envs=4"])
    learner = Learner(cfg, tmp_path)
    try:
        folder = tmp_path / "ledgers"
        folder.mkdir()
        after_read = ledger_path(folder, "actor0", 0xA)
        before_read = ledger_path(folder, "actor1", 0xB)
        for path in (after_read, before_read):
            path.write_bytes(RECORD.pack(64, 0, 0))

        def actor_renames(path):  # the actor's close(reported=True), landing mid-sweep
            if path == before_read:
                path.replace(path.with_suffix(".reported"))
            account = read_account(path)
            if path == after_read:
                path.replace(path.with_suffix(".reported"))
            return account

        monkeypatch.setattr(learner_main, "read_account", actor_renames)
        assert learner.count_unreported_lives() == 64  # actor0 read, then renamed by its actor
        assert sorted(p.name for p in folder.iterdir()) == ["actor0.0000000a.reported", "actor1.0000000b.reported"]
    finally:
        learner.close()
