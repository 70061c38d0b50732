"""gaussian_mlp with `instruction_dim` > 0: the instruction is part of the observation it acts on."""

import pytest
import torch

from rlfleet.envs.api import encode_instructions
from rlfleet.policies.registry import make_policy
from rlfleet.policies.vla.tokenizer import WordTokenizer


def _policy(**settings):
    torch.manual_seed(0)
    return make_policy({"name": "gaussian_mlp", "instruction_dim": 8, **settings}, 5, 2, 1)


def _obs(texts, states=None):
    n = len(texts)
    return {
        "states": torch.zeros(n, 5) if states is None else states,
        "instructions": torch.from_numpy(encode_instructions(texts)),
    }


def test_it_reads_instructions_and_embeds_the_words_alone():
    policy = _policy()
    assert policy.obs_keys == ("states", "instructions")
    assert make_policy({"name": "gaussian_mlp"}, 5, 2, 1).obs_keys == ("states",)
    texts = ["lift the red block", "lift the blue block"]
    x = policy._obs_features(_obs(texts))
    # the features: the (normalised) state, then the mean embedding of the instruction's words;
    # the tokenizer pads 4 words to 16 ids with id 0, and those are left out of the mean
    ids = WordTokenizer(1024).encode_text(texts[1])
    assert len(ids) == 4 and torch.allclose(x[1, 5:], policy.word_embed.weight[ids].mean(0))
    assert not torch.allclose(x[0, 5:], x[1, 5:])
    # words, not characters: case, punctuation and spacing do not change the features
    assert torch.equal(x[0], policy._obs_features(_obs(["Lift the  red block."]))[0])


def test_the_instruction_changes_the_action_and_the_value():
    policy = _policy()
    out = policy.act(_obs(["open the drawer", "push the sliding door"]), deterministic=True)
    assert not torch.allclose(out["actions"][0], out["actions"][1])
    assert out["values"][0] != out["values"][1]
    logp, _, value = policy.evaluate(_obs(["open the drawer", "push the sliding door"]), out["actions"])
    assert torch.allclose(logp, out["logprobs"], atol=1e-5) and torch.allclose(value, out["values"])


def test_behaviour_cloning_tells_instructions_apart_in_the_same_state():
    """Two instructions, one state, opposite expert actions: only the instruction can separate them."""
    policy = _policy()
    texts = ["turn on the led", "turn off the led"] * 16
    obs = _obs(texts)
    target = torch.tensor([[1.0, -1.0], [-1.0, 1.0]] * 16).reshape(32, 1, 2) * 0.5
    opt = torch.optim.Adam(policy.parameters(), lr=1e-2)
    for _ in range(300):
        opt.zero_grad()
        policy.sft_loss(obs, target).backward()
        opt.step()
    mean = policy.act(_obs(texts[:2]), deterministic=True)["actions"]
    assert torch.allclose(mean, target[:2], atol=0.05)


def test_bad_settings_and_missing_instructions_are_one_line_errors():
    with pytest.raises(ValueError, match="instruction_dim must be >= 0"):
        make_policy({"name": "gaussian_mlp", "instruction_dim": -1}, 5, 2, 1)
    with pytest.raises(ValueError, match="instruction_max_words >= 1, got 8, 1024, 0"):
        make_policy({"name": "gaussian_mlp", "instruction_dim": 8, "instruction_max_words": 0}, 5, 2, 1)
    with pytest.raises(ValueError, match="reads instructions"):
        _policy().act({"states": torch.zeros(1, 5)})
