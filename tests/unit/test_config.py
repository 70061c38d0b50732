import pytest
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from rlfleet.config import ConfigError, config_from_yaml, load_config, recipe_files, recipe_names, run_schema, to_yaml

RECIPES = recipe_names()


def leaves(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from leaves(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


def test_recipes_are_found():
    assert "metaworld_reach_ppo" in RECIPES
    assert RECIPES == sorted(RECIPES)


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_loads_with_its_values(name):
    cfg = load_config(name)
    # the recipe's blocks (its defaults list, in order) then its own keys: the later file wins
    merged: dict = {}
    for path in recipe_files(name):
        raw = yaml.safe_load(path.read_text()) or {}  # a block may hold only comments (scale/cpu)
        merged.update({k: v for k, v in leaves(raw) if k not in ("defaults", "description")})
    checked = 0
    for key, value in merged.items():
        got = OmegaConf.select(cfg, key)
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        assert got == value, key
        checked += 1
    assert checked > 0
    # schema defaults fill what the recipe leaves out, and interpolations resolve
    assert cfg.inference.host == "127.0.0.1" and cfg.learner.host == "127.0.0.1"
    assert cfg.runner.logger.log_path == f"runs/{cfg.runner.experiment_name}"


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_splits_its_envs_over_stages_and_workers(name):
    """What an actor checks at start (a calvin recipe once shipped 10 envs over 2 x 2)."""
    from rlfleet.actors.env_worker import stage_slices

    a = load_config(name).actor
    stage_slices(a.num_envs, a.pipeline_stage_num, a.num_workers, 0)


def test_no_recipe_gives_schema_defaults():
    cfg = load_config(None)
    assert OmegaConf.to_container(cfg, resolve=True) == OmegaConf.to_container(run_schema(), resolve=True)


def test_overrides_apply_with_their_types():
    cfg = load_config(
        "metaworld_reach_ppo",
        [
            "actor.num_envs=8",
            "algorithm.lr=1e-3",
            "policy.hidden_sizes=[64,32]",
            "runner.resume=true",
            "algorithm.dual_clip=3.0",
            "runner.experiment_name=other",
        ],
    )
    assert cfg.actor.num_envs == 8 and isinstance(cfg.actor.num_envs, int)
    assert cfg.algorithm.lr == pytest.approx(1e-3) and isinstance(cfg.algorithm.lr, float)
    assert list(cfg.policy.hidden_sizes) == [64, 32]
    assert cfg.runner.resume is True
    assert cfg.algorithm.dual_clip == 3.0
    assert cfg.runner.logger.log_path == "runs/other"  # interpolation follows the override
    # the rest of the recipe stays
    plain = load_config("metaworld_reach_ppo")
    assert cfg.env == plain.env and cfg.learner == plain.learner


@pytest.mark.parametrize(
    "override",
    ["actor.num_envs=abc", "algorithm.lr=fast", "runner.resume=maybe", "policy.hidden_sizes=[a]"],
)
def test_override_of_the_wrong_type_raises(override):
    with pytest.raises(
        ConfigError, match="bad value for (actor.num_envs|algorithm.lr|runner.resume|policy.hidden_sizes)"
    ):
        load_config("metaworld_reach_ppo", [override])


@pytest.mark.parametrize("override", ["actor.nope=1", "nope.x=1", "algorithm.learning_rate=0.1"])
def test_unknown_key_raises(override):
    with pytest.raises(ConfigError, match="unknown config key .*(nope|learning_rate)"):
        load_config("metaworld_reach_ppo", [override])


@pytest.mark.parametrize("overrides", [["runner.total_env_steps=2000"], ["runner.total_env_steps=0"]])
def test_a_budget_that_ends_before_the_first_update_is_refused(overrides):
    with pytest.raises(ConfigError, match=r"runner.total_env_steps=\d+ is less than one update .*batch_samples=4096"):
        load_config("metaworld_reach_ppo", overrides)
    # a sample is a chunk: the quickstart's update takes 1600 samples of 8 env steps
    with pytest.raises(ConfigError, match=r"less than one update \(up to 12800 env steps: .*env.chunk_size=8\)"):
        load_config("metaworld_quickstart_tinyoft", ["runner.total_env_steps=5000"])
    small = ["runner.total_env_steps=64", "learner.batch_samples=64", "actor.num_envs=8"]
    assert load_config("metaworld_reach_ppo", small)
    assert load_config("metaworld_reach_ppo", ["runner.total_env_steps=0", "runner.only_eval=true"])


def test_an_actor_whose_segments_outgrow_the_lag_bound_is_refused_when_paced():
    # 1,024 envs x 32 steps = 32,768 samples; max_policy_lag 4 x 2,048 = 8,192 (rlfleet.learner.pacing)
    many = ["actor.num_envs=1024", "learner.batch_samples=2048"]
    with pytest.raises(ConfigError, match=r"segments hold 32768 samples .* = 8192\), .*at least 8192") as err:
        load_config("metaworld_reach_ppo", many)
    assert "\n" not in str(err.value)
    assert load_config("metaworld_reach_ppo", [*many, "learner.flow_control=drop"])  # the user's choice
    assert load_config("metaworld_reach_ppo", ["actor.num_envs=1024", "learner.batch_samples=8192"])


def test_a_wrist_camera_policy_needs_the_envs_wrist_camera():
    with pytest.raises(ConfigError, match="policy.wrist_camera reads wrist_images: set env.wrist_camera=true too"):
        load_config("calvin_d_d_ppo_tinypi0_cpu", ["policy.wrist_camera=true"])
    cfg = load_config("calvin_d_d_ppo_tinypi0_cpu", ["policy.wrist_camera=true", "env.wrist_camera=true"])
    assert cfg.env.wrist_camera and cfg.policy.wrist_camera
    assert load_config("calvin_d_d_ppo_tinypi0_cpu").env.wrist_camera is False


def test_override_without_equals_is_a_value_error():
    with pytest.raises(ValueError, match="key=value") as info:
        load_config("metaworld_reach_ppo", ["actor.num_envs=4", "actor.num_envs"])
    assert "actor.num_envs" in str(info.value)


def test_unknown_recipe_raises():
    with pytest.raises(FileNotFoundError, match="unknown recipe 'no_such_recipe'"):
        load_config("no_such_recipe")


def test_recipe_from_a_yaml_file(tmp_path):
    good = tmp_path / "mine.yaml"
    good.write_text("actor:\n  num_envs: 6\nalgorithm:\n  gamma: 0.9\n")
    cfg = load_config(str(good))
    assert cfg.actor.num_envs == 6 and cfg.algorithm.gamma == 0.9
    assert cfg.runner.experiment_name == "mine" and cfg.runner.logger.log_path.endswith("mine")
    named = tmp_path / "named.yaml"
    named.write_text("runner:\n  experiment_name: other\n")
    assert load_config(str(named)).runner.experiment_name == "other"  # the file's own name wins
    bad = tmp_path / "bad.yaml"
    bad.write_text("actor:\n  num_envz: 6\n")
    with pytest.raises(
        ConfigError, match=r"unknown config key actor.num_envz \(in .*bad.yaml\); did you mean actor.num_envs"
    ):
        load_config(str(bad))


@pytest.mark.parametrize("name", RECIPES)
def test_yaml_round_trip(name):
    cfg = load_config(name, ["actor.num_envs=12", "runner.seed=3", "algorithm.dual_clip=2.5"])
    text = to_yaml(cfg)
    back = config_from_yaml(text)
    assert OmegaConf.to_container(back, resolve=True) == OmegaConf.to_container(cfg, resolve=True)
    assert to_yaml(back) == text
    # the rebuilt config is still typed: a bad value is refused
    with pytest.raises(ValidationError):
        back.actor.num_envs = "abc"


def test_config_from_yaml_rejects_unknown_keys():
    with pytest.raises(ConfigKeyError):
        config_from_yaml("learner:\n  batch_envsteps: 5\n")


def test_recipe_names_are_recipes_not_blocks():
    assert "metaworld_quickstart_tinyoft" in RECIPES
    assert not any("/" in n for n in RECIPES) and "ppo_vla" not in RECIPES


def test_defaults_merge_in_order_then_the_file_itself(tmp_path):
    (tmp_path / "algo").mkdir()
    (tmp_path / "algo" / "mine.yaml").write_text("defaults:\n  - algo/ppo_vla\nalgorithm:\n  lr: 0.5\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("defaults:\n  - algo/mine\n  - model/tiny_oft\nalgorithm:\n  gamma: 0.5\n")
    # local blocks first, then the packaged ones; a block's own defaults come before it
    assert [p.name for p in recipe_files(str(recipe))] == ["ppo_vla.yaml", "mine.yaml", "tiny_oft.yaml", "r.yaml"]
    cfg = load_config(str(recipe))
    assert cfg.algorithm.lr == 0.5  # the local block over the packaged algo/ppo_vla
    assert cfg.algorithm.gamma == 0.5  # the recipe over its blocks
    assert cfg.algorithm.kl_beta == 0.1  # from algo/ppo_vla
    assert cfg.policy.name == "tiny_oft"
    assert cfg.runner.experiment_name == "r"  # a YAML file's runs are named after the file
    assert load_config(str(recipe), ["algorithm.gamma=0.25"]).algorithm.gamma == 0.25  # overrides last


def test_packaged_recipe_is_named_after_itself_and_eval_recipes_are_an_override():
    cfg = load_config("robotwin_place_empty_cup_ppo_tinyoft_eval")
    assert cfg.runner.experiment_name == "robotwin_place_empty_cup_ppo_tinyoft_eval"
    train = load_config("robotwin_place_empty_cup_ppo_tinyoft", ["runner.only_eval=true"])
    assert cfg.runner.only_eval is True
    same = OmegaConf.to_container(cfg, resolve=True)
    same["runner"].pop("experiment_name"), same["runner"]["logger"].pop("log_path")
    other = OmegaConf.to_container(train, resolve=True)
    other["runner"].pop("experiment_name"), other["runner"]["logger"].pop("log_path")
    assert same == other


def test_defaults_errors_are_one_line(tmp_path):
    unknown = tmp_path / "u.yaml"
    unknown.write_text("defaults:\n  - algo/nope\n")
    with pytest.raises(FileNotFoundError, match="unknown entry 'algo/nope' in defaults"):
        load_config(str(unknown))
    cycle_a, cycle_b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    cycle_a.write_text("defaults:\n  - b\n")
    cycle_b.write_text("defaults:\n  - a\n")
    with pytest.raises(ValueError, match="cycle: a -> b -> a"):
        load_config(str(cycle_a))
    not_a_list = tmp_path / "n.yaml"
    not_a_list.write_text("defaults: algo/ppo_vla\n")
    with pytest.raises(ValueError, match="defaults must be a list"):
        load_config(str(not_a_list))


def test_every_block_is_valid_config():
    from rlfleet.config import RECIPE_DIR

    blocks = [
        p
        for d in RECIPE_DIR.iterdir()
        if d.is_dir() and not d.name.startswith("_")
        for p in d.iterdir()
        if p.name.endswith(".yaml")
    ]
    assert len(blocks) >= 12
    for block in blocks:
        raw = yaml.safe_load(block.read_text()) or {}  # scale/cpu: comments only
        # VLA settings (dim, proprio_dims, ...) are checked against a VLA policy when the block names none
        unnamed = "policy" in raw and "name" not in raw["policy"]
        cfg = load_config(str(block), ["policy.name=tiny_pi0"] if unnamed else [])  # bad keys/types fail here
        assert cfg.runner.experiment_name == block.stem  # a block never names the run: its file does


def test_eval_env_keeps_the_benchmark_budget_and_the_held_out_pool():
    from rlfleet.eval.splits import eval_env_config

    cfg = load_config("calvin_d_d_ppo_tinypi0_cpu", ["env.subtask_steps=120", "eval_env.task=ABC"])
    assert cfg.env.subtask_steps == 120 and cfg.env.pool == "train"
    env = eval_env_config(cfg)
    assert (env.subtask_steps, env.pool, env.task, env.image_size) == (0, "eval", "ABC", 64)


def test_gym_kwargs_are_a_mapping_for_gym_envs_only():
    cfg = load_config("gym_inverted_pendulum_ppo", ["env.gym_kwargs.reset_noise_scale=0.2", "env.gym_kwargs.x=[1,2]"])
    assert OmegaConf.to_container(cfg.env.gym_kwargs) == {"reset_noise_scale": 0.2, "x": [1, 2]}
    assert "gym_kwargs:\n    reset_noise_scale: 0.2" in to_yaml(cfg)
    with pytest.raises(ConfigError, match="env.gym_kwargs is not a setting of env metaworld"):
        load_config("metaworld_reach_ppo", ["env.gym_kwargs.reward_type=dense"])


def test_renamed_key_says_its_new_name(tmp_path):
    """learner.batch_env_steps counted samples, not env steps: the old key gets one line naming the new one."""
    with pytest.raises(ConfigError) as err:
        load_config("metaworld_reach_ppo", ["learner.batch_env_steps=64"])
    assert str(err.value).startswith("learner.batch_env_steps was renamed to learner.batch_samples: ")
    assert "\n" not in str(err.value)
    recipe = tmp_path / "old.yaml"
    recipe.write_text("defaults: [metaworld_reach_ppo]\nlearner:\n  batch_env_steps: 64\n")
    with pytest.raises(ConfigError, match=r"^learner.batch_env_steps was renamed to learner.batch_samples: .*old.yaml"):
        load_config(str(recipe))
