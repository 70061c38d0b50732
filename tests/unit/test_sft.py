"""SFT data assembly and an end-to-end `run_sft` on a tiny expert dataset."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from rlfleet.config import SFTConfig
from rlfleet.data.demos import DemoEpisode
from rlfleet.envs.api import EnvConfig, encode_instructions
from rlfleet.policies.checkpoint_io import load_checkpoint, policy_from_config
from rlfleet.policies.vla.normalization import load_norm_stats
from rlfleet.runs.collect import collect_env_demos
from rlfleet.runs.sft import _shift, action_chunks, build_sft_data, run_sft


def _episode(i: int, L: int, size: int = 8) -> DemoEpisode:
    rng = np.random.default_rng(i)
    return DemoEpisode(
        id=i,
        task="reach-v3",
        instruction_text="reach the goal position",
        seed=i,
        success=True,
        success_step=L - 1,
        states=rng.normal(size=(L, 39)).astype(np.float32),
        actions=rng.uniform(-1, 1, (L, 4)).astype(np.float32),
        rewards=np.zeros(L, np.float32),
        step_success=np.zeros(L, bool),
        instruction=encode_instructions(["reach the goal position"])[0],
        main_images=rng.integers(0, 255, (L, size, size, 3), dtype=np.uint8),
    )


def test_action_chunks_pad_with_the_last_action():
    a = np.arange(10, dtype=np.float32).reshape(5, 2)
    c = action_chunks(a, 3)
    assert c.shape == (5, 3, 2)
    np.testing.assert_array_equal(c[0], a[0:3])
    np.testing.assert_array_equal(c[3], np.stack([a[3], a[4], a[4]]))
    np.testing.assert_array_equal(c[4], np.stack([a[4]] * 3))


def test_build_sft_data_flattens_episodes():
    eps = [_episode(0, 5), _episode(1, 3)]
    data = build_sft_data(eps, chunk_size=2)
    assert len(data) == 8
    assert data.obs["main_images"].shape == (8, 8, 8, 3) and data.obs["states"].shape == (8, 39)
    assert data.obs["instructions"].shape == (8, 128)
    np.testing.assert_array_equal(data.episode, [0] * 5 + [1] * 3)
    np.testing.assert_array_equal(data.actions[5], eps[1].actions[0:2])
    np.testing.assert_array_equal(data.obs["main_images"][6], eps[1].main_images[1])
    with pytest.raises(ValueError, match="no demonstration"):
        build_sft_data([], 2)


def test_shift_moves_images_by_at_most_pad_pixels():
    img = torch.zeros(4, 8, 8, 3, dtype=torch.uint8)
    img[:, 4, 4] = 255
    out = _shift(img, 2, torch.Generator().manual_seed(0))
    assert out.dtype == torch.uint8 and out.shape == img.shape
    for b in range(4):
        ys, xs = np.nonzero(out[b, :, :, 0].numpy())
        assert len(ys) == 1 and abs(ys[0] - 4) <= 2 and abs(xs[0] - 4) <= 2
    assert torch.equal(_shift(img, 0, torch.Generator()), img)


def test_run_sft_writes_a_checkpoint_the_fleet_can_load(tmp_path):
    demos = tmp_path / "demos"
    collect_env_demos(demos, EnvConfig(task="reach-v3", image_size=32, max_episode_steps=60), 2, progress=False)
    env = EnvConfig(task="reach-v3", image_size=32, chunk_size=4, max_episode_steps=60)
    policy_cfg = {"name": "tiny_oft", "depth": 1, "unnorm_key": "metaworld_test"}
    out = tmp_path / "sft"
    summary = run_sft(demos, out, policy_cfg, env, SFTConfig(steps=60, batch_size=16, threads=1), progress=False)
    log = json.loads((out / "sft_log.json").read_text())
    assert log["samples"] == summary["samples"] > 0
    assert log["history"][-1]["loss"] < log["history"][0]["loss"]  # behaviour cloning makes progress
    stats = load_norm_stats(out, "metaworld_test")
    assert len(stats["action"]["q01"]) == 4
    with pytest.raises(KeyError, match="metaworld_test"):
        load_norm_stats(out, "libero")

    policy, cfg = load_checkpoint(out)
    assert cfg["image_size"] == 32 and cfg["chunk_size"] == 4
    torch.testing.assert_close(policy.norm.action_q01, torch.tensor(stats["action"]["q01"]))
    # the learner's way in: model_path plus the run's dims; a run with other dims is refused
    again = policy_from_config({"name": "tiny_oft", "model_path": str(out), "temperature": 0.5}, 39, 4, 4, 32)
    assert again.cfg.temperature == 0.5
    for k, v in policy.state_dict().items():
        assert torch.equal(again.state_dict()[k], v), k
    with pytest.raises(ValueError, match="image_size 32 .run needs 64"):
        policy_from_config({"model_path": str(out)}, 39, 4, 4, 64)
    with pytest.raises(ValueError, match="holds a 'tiny_oft' policy"):
        policy_from_config({"name": "tiny_pi0", "model_path": str(out)}, 39, 4, 4, 32)


def test_sft_cache_is_shared_by_runs_that_differ_only_in_sampling():
    from rlfleet.config import load_config
    from rlfleet.runs.bootstrap import sft_folder

    base = sft_folder(load_config("metaworld_quickstart_tinyoft"))
    assert (
        sft_folder(load_config("metaworld_quickstart_tinyoft", ["policy.temperature=1.0", "policy.logprob_type=token"]))
        == base
    )
    assert sft_folder(load_config("metaworld_quickstart_tinyoft", ["policy.dim=32"])) != base
    assert sft_folder(load_config("metaworld_quickstart_tinyoft", ["sft.steps=10"])) != base
    # Flow-SDE and Flow-Noise start from the same flow-matching SFT (their RL-only parts are not trained by it)
    assert sft_folder(load_config("metaworld_50_ppo_tinypi0_cpu")) == sft_folder(
        load_config("metaworld_50_ppo_tinypi0_flownoise_cpu")
    )


def test_mlp_sft_fits_observation_statistics_to_the_demos():
    from rlfleet.policies import GaussianMLPPolicy, PolicyConfig
    from rlfleet.runs.sft import train_sft

    data = build_sft_data([_episode(0, 30), _episode(1, 20)], chunk_size=1)
    data.obs["states"] = data.obs["states"] * 3.0 + 5.0
    policy = GaussianMLPPolicy(39, 4, 1, PolicyConfig(hidden_sizes=[16]))
    train_sft(policy, data, SFTConfig(steps=2, batch_size=8), progress=False)
    np.testing.assert_allclose(policy.obs_norm.mean.numpy(), data.obs["states"].mean(0), atol=1e-3)
    np.testing.assert_allclose(policy.obs_norm.var.numpy(), data.obs["states"].var(0), rtol=1e-2)


def test_demos_task_collects_on_its_own_tasks_and_keeps_their_cache(tmp_path, monkeypatch):
    """RL on any layout (`env.task=...:any`) from demos of the train split (`demos.task`): the demo
    and SFT caches are those of a run whose env.task was the train split."""
    from rlfleet.config import load_config
    from rlfleet.runs import bootstrap

    train, every = "click_bell:train,adjust_bottle:train", "click_bell:any,adjust_bottle:any"
    recipe, cache = "robotwin_multitask_ppo_mlp_cpu", f"demos.cache_dir={tmp_path}"
    on_train = load_config(recipe, [f"env.task={train}", cache])  # demos on env.task itself
    split = load_config(recipe, [f"env.task={every}", f"demos.task={train}", cache])
    assert bootstrap.demos_folder(split) == bootstrap.demos_folder(on_train)
    assert bootstrap.sft_folder(split) == bootstrap.sft_folder(on_train)
    on_every = load_config(recipe, [f"env.task={every}", cache])
    assert bootstrap.demos_folder(on_every) != bootstrap.demos_folder(on_train)

    class Collected(Exception):
        pass

    def collect(folder, env, episodes, seed, progress):
        raise Collected(env.task)

    monkeypatch.setattr(bootstrap, "collect_env_demos", collect)
    with pytest.raises(Collected, match=f"^{train}$"):
        bootstrap.ensure_sft_checkpoint(split, progress=False)


def test_the_recipes_sft_start_records_how_the_recipe_evaluates(tmp_path, monkeypatch):
    """The SFT checkpoint a run builds for itself records the recipe's evaluation (RoboTwin's
    X:eval layouts), so `rlfleet eval` of the cached start plays the held-out layouts."""
    from rlfleet.config import load_config
    from rlfleet.eval.splits import eval_env_config, split_seed
    from rlfleet.runs import bootstrap

    cfg = load_config("robotwin_multitask_ppo_mlp_cpu", [f"demos.cache_dir={tmp_path}"])
    (bootstrap.demos_folder(cfg)).mkdir(parents=True)
    (bootstrap.demos_folder(cfg) / "index.json").write_text("{}")  # demos present: straight to SFT
    seen = {}
    monkeypatch.setattr(bootstrap, "run_sft", lambda *args, **kwargs: seen.update(kwargs))
    bootstrap.ensure_sft_checkpoint(cfg, progress=False)
    assert seen["evaluation"] == {
        "task": cfg.eval_env.task,
        "seed": cfg.eval.seed,
        "validation_seed": cfg.eval.validation_seed,
        "episodes_per_task": cfg.eval.episodes_per_task,
    }
    assert cfg.eval_env.task.split(",")[0].endswith(":eval")
    # its curve (sft.eval_every) plays the recipe's held-out evaluation, as its RL evaluations do
    assert seen["eval_env"] == eval_env_config(cfg) and seen["eval_seed"] == split_seed(cfg.eval)


def test_sft_evaluations_during_training_play_the_recipes_split(tmp_path, monkeypatch):
    """sft.eval_every plays the recipe's evaluation env (`eval_env`) from its `eval.split`'s
    first seed, not the training env from the test seeds."""
    from rlfleet.cli import main
    from rlfleet.runs import sft

    played = []

    def recording(policy, env, episodes, seed, **kwargs):
        played.append((env.task, seed))
        return {env.task: 0.0}

    monkeypatch.setattr(sft, "evaluate_policy", recording)
    demos = tmp_path / "demos"
    collect_env_demos(demos, EnvConfig(task="reach-v3", max_episode_steps=60), 1, progress=False)
    overrides = ["env.task=reach-v3", "env.max_episode_steps=60", "sft.steps=4", "sft.eval_every=2", "sft.threads=1"]
    overrides += ["eval_env.task=push-v3", "eval.split=validation", "eval.validation_seed=600000"]
    assert main(["sft", "metaworld_reach_ppo", "--demos", str(demos), "--out", str(tmp_path / "sft"), *overrides]) == 0
    assert played == [("push-v3", 600_000)]


def test_goal_marker_gets_its_own_demo_cache_and_leaves_the_others_keys_alone(tmp_path):
    from rlfleet.config import load_config
    from rlfleet.runs import bootstrap

    cache = f"demos.cache_dir={tmp_path}"
    stock = load_config("metaworld_quickstart_tinyoft", [cache, "env.goal_marker_size=0"])
    marked = load_config("metaworld_quickstart_tinyoft", [cache, "env.goal_marker_size=0.05"])
    e, d = stock.env, stock.demos
    # the key a run without the marker had before the setting existed, plus MetaWorld's demos revision
    base = ["demos", e.task, e.image_size, e.camera, e.max_episode_steps, d.episodes_per_task, d.seed]
    assert bootstrap.demos_folder(stock).name == f"demos-{bootstrap._key(*base, ['demos_revision', 1])}"
    assert bootstrap.demos_folder(marked) != bootstrap.demos_folder(stock)
    assert bootstrap.sft_folder(marked) != bootstrap.sft_folder(stock)
    # without frames the marker changes nothing, so state-only demos keep one cache
    states = [cache, "env.image_size=0"]
    assert bootstrap.demos_folder(load_config("metaworld_quickstart_tinyoft", states)) == bootstrap.demos_folder(
        load_config("metaworld_quickstart_tinyoft", [*states, "env.goal_marker_size=0"])
    )


def test_wrist_camera_gets_its_own_demo_and_sft_caches(tmp_path):
    from rlfleet.config import load_config
    from rlfleet.runs import bootstrap

    cache = f"demos.cache_dir={tmp_path}"
    plain = load_config("calvin_d_d_ppo_tinypi0_cpu", [cache])
    explicit = load_config("calvin_d_d_ppo_tinypi0_cpu", [cache, "env.wrist_camera=false"])
    wrist = load_config("calvin_d_d_ppo_tinypi0_cpu", [cache, "env.wrist_camera=true", "policy.wrist_camera=true"])
    assert bootstrap.demos_folder(explicit) == bootstrap.demos_folder(plain)  # older caches stay valid
    assert bootstrap.sft_folder(explicit) == bootstrap.sft_folder(plain)
    assert bootstrap.demos_folder(wrist) != bootstrap.demos_folder(plain)
    assert bootstrap.sft_folder(wrist) != bootstrap.sft_folder(plain)


def test_a_demos_revision_renews_that_envs_demo_caches_only(tmp_path):
    """An env whose demos changed for the same seeds (DEMOS_REVISION) gets new demo caches, with
    or without frames; an env at revision 0 keeps its keys."""
    from rlfleet.config import load_config
    from rlfleet.envs.metaworld import MetaWorldEnv
    from rlfleet.runs import bootstrap

    cache = f"demos.cache_dir={tmp_path}"
    assert MetaWorldEnv.DEMOS_REVISION == 1
    states = load_config("metaworld_quickstart_tinyoft", [cache, "env.image_size=0"])
    e, d = states.env, states.demos
    unrevised = ["demos", e.task, 0, e.camera, e.max_episode_steps, d.episodes_per_task, d.seed]
    assert bootstrap.demos_folder(states).name == f"demos-{bootstrap._key(*unrevised, ['demos_revision', 1])}"
    robotwin = load_config("robotwin_multitask_ppo_mlp_cpu", [cache])
    r, rd = robotwin.env, robotwin.demos
    parts = ["demos", rd.task or r.task, r.image_size, r.camera, r.max_episode_steps, rd.episodes_per_task, rd.seed]
    assert bootstrap.demos_folder(robotwin).name == f"demos-{bootstrap._key(*parts)}"


def test_drop_noop_frames_needs_the_envs_gripper_dims():
    from rlfleet.runs.sft import without_noop_frames

    ep = _episode(0, 6)
    ep.actions[2:4, :3] = 0.0  # frames 2 and 3 move nothing
    ep.actions[2:4, 3] = ep.actions[1, 3]  # and repeat the gripper command
    (out,) = without_noop_frames([ep], "metaworld")  # MetaWorld declares its gripper dim (3)
    assert out.length == 4
    np.testing.assert_array_equal(out.states, ep.states[[0, 1, 4, 5]])
    with pytest.raises(ValueError, match="sft.drop_noop_frames needs env 'bench' to declare"):
        without_noop_frames([ep], "bench")


def test_drop_noop_frames_gets_its_own_sft_cache_and_leaves_the_others_keys_alone():
    from rlfleet.config import as_dict, load_config, policy_settings
    from rlfleet.runs import bootstrap

    stock = load_config("robotwin_multitask_ppo_mlp_cpu", ["sft.drop_noop_frames=false"])
    dropped = load_config("robotwin_multitask_ppo_mlp_cpu")  # the recipe drops them
    # the key a run had before the setting existed
    sft = {k: v for k, v in as_dict(stock.sft).items() if k not in ("device", "drop_noop_frames")}
    policy = {k: v for k, v in policy_settings(stock).items() if k not in bootstrap.SAMPLING_ONLY_KEYS}
    before = bootstrap._key("sft", str(bootstrap.demos_folder(stock)), policy, stock.env.chunk_size, sft)
    assert bootstrap.sft_folder(stock).name == f"sft-{before}"
    assert bootstrap.sft_folder(dropped) != bootstrap.sft_folder(stock)
    assert bootstrap.demos_folder(dropped) == bootstrap.demos_folder(stock)  # the same demos


def test_sft_eval_episodes_keeps_a_report_rlfleet_eval_replays(tmp_path):
    """`rlfleet sft --eval-episodes N` evaluates on the recipe's held-out evaluation env (its
    `eval_env.task` from `eval.seed`, not the env it trained on) and keeps its report and episodes in
    `rlfleet eval`'s form in CKPT/eval, so a later evaluation of the same env pairs with it."""
    from rlfleet.cli import main
    from rlfleet.eval.paired import read_episodes

    demos, out = tmp_path / "demos", tmp_path / "sft"
    collect_env_demos(demos, EnvConfig(task="reach-v3", max_episode_steps=60), 2, progress=False)
    overrides = ["env.task=reach-v3", "env.max_episode_steps=60", "sft.steps=5", "sft.threads=1"]
    overrides += ["eval_env.task=push-v3", "eval.seed=12345"]  # the recipe's episodes_per_task is 10
    args = ["sft", "metaworld_reach_ppo", "--demos", str(demos), "--out", str(out), "--eval-episodes", "2"]
    assert main([*args, *overrides]) == 0
    records = read_episodes(out / "eval")
    assert [(r["task"], r["seed"]) for r in records] == [("push-v3", 12_345), ("push-v3", 12_346)]
    report = json.loads((out / "eval" / "eval.json").read_text())
    assert report["mode"] == "deterministic" and report["tasks"][0]["episodes"] == 2
    assert (report["env"], report["seed"]) == ({"name": "metaworld", "task": "push-v3"}, 12_345)
    assert report["tasks"][0]["success"] == sum(r["success"] for r in records) / 2
    again = tmp_path / "again"
    compare = ["--out", str(again), "--compare", str(out / "eval")]
    assert main(["eval", str(out), "--task", "push-v3", "--seed", "12345", "--episodes", "2", *compare]) == 0
    assert read_episodes(again) == records
    # config.json records the recipe's evaluation, so a plain `rlfleet eval CKPT` replays it too
    assert json.loads((out / "config.json").read_text())["evaluation"] == {
        "task": "push-v3",
        "seed": 12_345,
        "validation_seed": 500_000,
        "episodes_per_task": 2,
    }
    assert main(["eval", str(out), "--out", str(tmp_path / "plain")]) == 0
    assert read_episodes(tmp_path / "plain") == records
    # a second `rlfleet sft` onto the same folder is refused before training, keeping it whole
    assert main([*args, *overrides]) == 2
    assert read_episodes(out / "eval") == records
    assert main([*args, *overrides, "--overwrite"]) == 0
