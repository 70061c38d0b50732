import dataclasses
import json
import random

import numpy as np
import pytest
import torch

from rlfleet.learner.checkpointer import Checkpointer, TrainerCounters
from rlfleet.policies import GaussianMLPPolicy, PolicyConfig
from rlfleet.policies.checkpoint_io import load_checkpoint, model_config, save_checkpoint_folder

S, D, K = 6, 3, 2
POLICY_CFG = PolicyConfig(hidden_sizes=[12, 8], activation="relu", init_log_std=-1.0)


def make_policy(seed: int) -> GaussianMLPPolicy:
    torch.manual_seed(seed)
    policy = GaussianMLPPolicy(S, D, K, PolicyConfig(**dataclasses.asdict(POLICY_CFG)))
    policy.update_normalization({"states": torch.randn(32, S) * 2 + 1})  # non-default buffers
    return policy


def trained(seed: int):
    """A policy and an Adam optimiser that has taken a few steps (so it has state)."""
    policy = make_policy(seed)
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    for _ in range(3):
        x = torch.randn(16, S)
        logp, ent, v = policy.evaluate({"states": x}, torch.randn(16, K, D))
        loss = -(logp.mean()) + v.pow(2).mean() - 0.01 * ent.mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return policy, opt


def mcfg():
    return model_config(dataclasses.asdict(POLICY_CFG), S, D, K, env={"name": "metaworld", "task": "reach-v3"})


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_save_then_restore_gives_back_everything(tmp_path):
    policy, opt = trained(0)
    counters = TrainerCounters(update=7, version=7, env_steps=12345, samples=6789, wall_seconds=42.5)
    ck = Checkpointer(tmp_path, keep=3)
    torch.manual_seed(123)
    np.random.seed(456)
    random.seed(789)
    folder = ck.save(policy, opt, counters, mcfg())
    assert folder == tmp_path / "checkpoints" / "update_000007"
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "model.safetensors",
        "trainer_state.json",
        "trainer_state.safetensors",
        "training.json",
    ]
    expect_torch, expect_np, expect_py = torch.rand(5), np.random.rand(3), random.random()

    # a different policy / optimiser / RNG state, as a fresh process would have
    other, other_opt = trained(1)
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    restored = ck.restore(folder, other, other_opt)

    assert restored == counters
    assert_same_state(other, policy)
    a, b = opt.state_dict(), other_opt.state_dict()
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys() and len(a["state"]) > 0
    for idx, st in a["state"].items():
        for key, val in st.items():
            assert torch.equal(val, b["state"][idx][key]), (idx, key)
    assert torch.equal(torch.rand(5), expect_torch)
    np.testing.assert_array_equal(np.random.rand(3), expect_np)
    assert random.random() == expect_py


def test_latest_names_the_newest_and_only_keep_remain(tmp_path):
    policy, opt = trained(0)
    ck = Checkpointer(tmp_path, keep=2)
    assert ck.latest() is None
    for update in (1, 2, 3, 10):
        ck.save(policy, opt, TrainerCounters(update=update, version=update), mcfg())
        assert ck.latest() == tmp_path / "checkpoints" / f"update_{update:06d}"
    remaining = sorted(p.name for p in (tmp_path / "checkpoints").glob("update_*"))
    assert remaining == ["update_000003", "update_000010"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "update_000010"
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


def test_saving_the_same_update_twice_replaces_it(tmp_path):
    p1, o1 = trained(0)
    p2, o2 = trained(1)
    ck = Checkpointer(tmp_path, keep=3)
    ck.save(p1, o1, TrainerCounters(update=4), mcfg())
    folder = ck.save(p2, o2, TrainerCounters(update=4, env_steps=9), mcfg())
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["latest", "update_000004"]
    policy, _ = load_checkpoint(folder)
    assert_same_state(policy, p2)


def test_stray_tmp_folder_from_a_crash_never_becomes_latest(tmp_path):
    policy, opt = trained(0)
    ck = Checkpointer(tmp_path, keep=2)
    ck.save(policy, opt, TrainerCounters(update=5), mcfg())
    # a crash while writing update 6: its temp folder holds only part of the files
    stray = tmp_path / "checkpoints" / "update_000006.tmp"
    stray.mkdir()
    (stray / "config.json").write_text(json.dumps(mcfg()))
    assert ck.latest() == tmp_path / "checkpoints" / "update_000005"
    with pytest.raises(FileNotFoundError):
        load_checkpoint(stray)

    # later saves neither pick it up nor count it against `keep`
    ck.save(policy, opt, TrainerCounters(update=7), mcfg())
    ck.save(policy, opt, TrainerCounters(update=8), mcfg())
    assert ck.latest() == tmp_path / "checkpoints" / "update_000008"
    complete = sorted(p.name for p in (tmp_path / "checkpoints").glob("update_*") if not p.name.endswith(".tmp"))
    assert complete == ["update_000007", "update_000008"]


def test_latest_ignores_a_folder_without_trainer_state(tmp_path):
    policy, opt = trained(0)
    ck = Checkpointer(tmp_path, keep=3)
    folder = ck.save(policy, opt, TrainerCounters(update=1), mcfg())
    (folder / "trainer_state.json").unlink()
    assert ck.latest() is None


def test_trainer_state_loads_without_pickle(tmp_path, monkeypatch):
    """The optimiser, RNG and counters come back from safetensors + JSON: pickle is never called."""
    import pickle

    policy, opt = trained(0)
    ck = Checkpointer(tmp_path, info={"command": "rlfleet train x", "commit": "abc"})
    folder = ck.save(policy, opt, TrainerCounters(update=3, env_steps=77), mcfg())
    info = json.loads((folder / "training.json").read_text())
    assert info["command"] == "rlfleet train x" and info["counters"]["env_steps"] == 77

    def no_pickle(*a, **k):
        raise AssertionError("pickle used")

    monkeypatch.setattr(pickle, "load", no_pickle)
    monkeypatch.setattr(pickle, "loads", no_pickle)
    monkeypatch.setattr(pickle, "Unpickler", no_pickle)
    monkeypatch.setattr(torch, "load", no_pickle)
    other, other_opt = trained(1)
    assert ck.restore(folder, other, other_opt) == TrainerCounters(update=3, env_steps=77)
    assert_same_state(other, policy)


def test_old_trainer_state_pt_still_restores_weights_only(tmp_path):
    """A checkpoint from before the safetensors trainer state (trainer_state.pt, numpy RNG inside)."""
    policy, opt = trained(0)
    ck = Checkpointer(tmp_path)
    folder = ck.save(policy, opt, TrainerCounters(update=2), mcfg())
    for name in ("trainer_state.json", "trainer_state.safetensors"):
        (folder / name).unlink()
    np.random.seed(5)
    torch.save(
        {
            "optimizer": opt.state_dict(),
            "counters": vars(TrainerCounters(update=2, env_steps=5)),
            "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state(),
            "python_rng": random.getstate(),
        },
        folder / "trainer_state.pt",
    )
    expect = np.random.rand(2)
    assert ck.latest() == folder
    other, other_opt = trained(1)
    assert ck.restore(folder, other, other_opt).env_steps == 5
    np.testing.assert_array_equal(np.random.rand(2), expect)


def test_load_checkpoint_rebuilds_the_policy_from_the_folder_alone(tmp_path):
    policy, opt = trained(0)
    folder = Checkpointer(tmp_path).save(policy, opt, TrainerCounters(update=2), mcfg())
    loaded, cfg = load_checkpoint(folder)
    assert cfg == json.loads(json.dumps(mcfg()))
    assert isinstance(loaded, GaussianMLPPolicy)
    assert (loaded.state_dim, loaded.action_dim, loaded.chunk_size) == (S, D, K)
    assert loaded.cfg.hidden_sizes == [12, 8] and loaded.cfg.activation == "relu"
    assert_same_state(loaded, policy)
    x = {"states": torch.randn(4, S)}
    a = policy.act(x, deterministic=True)
    b = loaded.act(x, deterministic=True)
    for key in ("actions", "logprobs", "values"):
        assert torch.equal(a[key], b[key]), key


def test_load_checkpoint_of_a_plain_policy_folder(tmp_path):
    policy = make_policy(2)
    save_checkpoint_folder(tmp_path / "export", policy, mcfg())
    assert not (tmp_path / "export.tmp").exists()
    loaded, _ = load_checkpoint(tmp_path / "export")
    assert_same_state(loaded, policy)


def test_load_checkpoint_with_weights_of_another_shape_is_a_clear_error(tmp_path):
    folder = tmp_path / "ck"
    save_checkpoint_folder(folder, make_policy(0), mcfg())
    cfg = mcfg()
    cfg["policy"]["hidden_sizes"] = [16, 8]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"shape mismatch .*actor\.0\.weight: \(12, 6\) vs \(16, 6\)"):
        load_checkpoint(folder)


def test_config_json_records_every_setting_so_a_changed_default_cannot_change_an_old_checkpoint(tmp_path, monkeypatch):
    settings = {"name": "gaussian_mlp", "hidden_sizes": [12], "instruction_dim": 4}
    policy = GaussianMLPPolicy(S, D, K, PolicyConfig(**settings))
    save_checkpoint_folder(tmp_path / "ck", policy, model_config(settings, S, D, K))
    saved = json.loads((tmp_path / "ck" / "config.json").read_text())["policy"]
    assert saved == {**dataclasses.asdict(PolicyConfig()), **settings}  # the run's keys and the defaults
    assert (saved["instruction_vocab"], saved["instruction_max_words"]) == (1024, 16)
    # a later release with other defaults still rebuilds what was trained
    monkeypatch.setattr(PolicyConfig, "__init__", _with_defaults(instruction_vocab=64, instruction_max_words=2))
    assert PolicyConfig().instruction_vocab == 64
    loaded, _ = load_checkpoint(tmp_path / "ck")
    assert (loaded.tokenizer.vocab_size, loaded.tokenizer.max_len) == (1024, 16)
    assert_same_state(loaded, policy)


def _with_defaults(**defaults):
    init = PolicyConfig.__init__

    def patched(self, **kwargs):
        init(self, **{**defaults, **kwargs})

    return patched


def test_a_checkpoint_trained_from_another_records_the_settings_it_was_built_with(tmp_path):
    """RL from an SFT checkpoint: the run's policy section names model_path and what it changes; the
    checkpoint it writes holds the SFT checkpoint's other settings, not the defaults."""
    sft = {"name": "gaussian_mlp", "hidden_sizes": [12, 8], "activation": "relu"}
    save_checkpoint_folder(
        tmp_path / "sft", GaussianMLPPolicy(S, D, K, PolicyConfig(**sft)), model_config(sft, S, D, K)
    )
    recorded = model_config({"model_path": str(tmp_path / "sft"), "init_log_std": -2.0}, S, D, K)["policy"]
    assert recorded == {**dataclasses.asdict(PolicyConfig()), **sft, "init_log_std": -2.0}
    assert "model_path" not in recorded


def test_config_json_of_a_partial_old_style_record_still_loads(tmp_path):
    folder = tmp_path / "ck"
    save_checkpoint_folder(folder, make_policy(0), mcfg())
    cfg = json.loads((folder / "config.json").read_text())
    cfg["policy"] = {"hidden_sizes": [12, 8], "activation": "relu"}  # before config.json recorded defaults
    (folder / "config.json").write_text(json.dumps(cfg))
    loaded, _ = load_checkpoint(folder)
    assert_same_state(loaded, make_policy(0))


@pytest.mark.parametrize("present", [[], ["config.json"], ["model.safetensors"]])
def test_missing_files_give_a_clear_file_not_found(tmp_path, present):
    src = tmp_path / "full"
    save_checkpoint_folder(src, make_policy(0), mcfg())
    folder = tmp_path / "partial"
    folder.mkdir()
    for name in present:
        (folder / name).write_bytes((src / name).read_bytes())
    with pytest.raises(FileNotFoundError, match="not a checkpoint folder .*config.json and model.safetensors"):
        load_checkpoint(folder)
    with pytest.raises(FileNotFoundError, match="does-not-exist does not exist"):
        load_checkpoint(tmp_path / "does-not-exist")


def test_a_fresh_run_in_a_used_folder_moves_the_old_outputs_aside(tmp_path):
    from rlfleet.learner.main import archive_previous_run

    assert archive_previous_run(tmp_path) is None
    (tmp_path / "checkpoints" / "update_000105").mkdir(parents=True)
    (tmp_path / "summary.json").write_text("{}")
    (tmp_path / "logs").mkdir()
    dest = archive_previous_run(tmp_path)
    assert (dest / "checkpoints" / "update_000105").is_dir() and (dest / "summary.json").exists()
    assert not (tmp_path / "checkpoints").exists() and (tmp_path / "logs").exists()


def test_rlfleet_train_moves_an_earlier_runs_start_and_episodes_aside_before_its_own(tmp_path, monkeypatch):
    """The start's evaluation is written before the learner starts: `rlfleet train` moves the
    earlier run's (and its episode files and periodic evaluations) with its other outputs, so a
    new run's final episodes are never paired with an old start."""
    from omegaconf import OmegaConf

    from rlfleet.runs import launcher

    old = ["episodes_before.jsonl", "eval_before.json", "episodes.jsonl", "summary.json"]
    for name in old:
        (tmp_path / name).write_text("old")
    (tmp_path / "periodic_eval" / "update_000010").mkdir(parents=True)
    cfg = OmegaConf.create({"runner": {"resume": False}, "eval": {"before": False}, "actor": {"num_actors": 1}})
    seen = {}
    monkeypatch.setattr(launcher, "metrics_ports", lambda *a: None)
    monkeypatch.setattr(launcher, "_run_fleet", lambda *a: seen.update(left=sorted(p.name for p in tmp_path.iterdir())))
    launcher._train_fleet(cfg, tmp_path, None, 0, "127.0.0.1")
    assert seen["left"] == ["previous"]  # what the learner then finds: nothing of the earlier run
    (dest,) = (tmp_path / "previous").iterdir()
    assert sorted(p.name for p in dest.iterdir()) == sorted([*old, "periodic_eval"])
