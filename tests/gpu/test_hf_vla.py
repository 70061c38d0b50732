"""The transformers VLA family on CUDA (`make test-gpu`; every test skips without CUDA):

- the tiny configs with LoRA under bf16 autocast: act and evaluate agree, SFT steps lower the loss;
- a short SFT -> PPO run of the CPU recipe with the learner, the inference server and SFT on the GPU;
- the real architectures with random weights (PaliGemma-3B for hf_oft and hf_pi0, SmolVLM-256M for
  hf_oft; LoRA rank 16): GPU memory, act latency at batch 1/8/32 and one learner update. These print
  one JSON line each (pytest -s) and append it to $RLFLEET_GPU_REPORT (default
  runs/gpu_hf_vla.jsonl), the figures docs/performance.md takes with the date and card.

    RLFLEET_GPU_DEVICE=cpu RLFLEET_GPU_BATCHES=1 pytest -s tests/gpu/test_hf_vla.py -k smolvlm  # on a CPU
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from rlfleet.envs.api import encode_instructions  # noqa: E402
from rlfleet.policies.registry import make_policy  # noqa: E402

DEVICE = os.environ.get("RLFLEET_GPU_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(
    DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device (RLFLEET_GPU_DEVICE=cpu to dry-run)"
)
LORA16 = {
    "lora_rank": 16,
    "lora_alpha": 32.0,
    "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


def _obs(n: int, image: int, state: int = 8) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return {
        "main_images": torch.randint(0, 256, (n, image, image, 3), dtype=torch.uint8, generator=g).to(DEVICE),
        "states": torch.randn(n, state, generator=g).to(DEVICE),
        "instructions": torch.from_numpy(encode_instructions(["pick up the red block and place it"] * n)).to(DEVICE),
    }


@pytest.fixture(autouse=True)
def backbones(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("RLFLEET_BACKBONES", str(tmp_path_factory.getbasetemp() / "backbones"))


@pytest.mark.parametrize("name", ["hf_oft", "hf_pi0"])
def test_tiny_config_bf16_lora(name):
    torch.manual_seed(0)
    settings = {"name": name, "backbone": "builtin:tiny-paligemma", "lora_rank": 8, "expert_width": 32, "bf16": True}
    p = make_policy(settings, 8, 4, 5, image_size=64).to(DEVICE)
    o = _obs(16, 64)
    out = p.act(o)
    logp, _, _ = p.evaluate(o, out["actions"], {k: out[k] for k in p.extra_outputs})
    torch.testing.assert_close(logp, out["logprobs"], rtol=0.05, atol=0.05)  # bf16 matmuls
    opt = torch.optim.Adam([q for q in p.parameters() if q.requires_grad], lr=3e-3)
    target = out["actions"].detach()
    losses = []
    for _ in range(20):
        loss = p.sft_loss(o, target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


def test_short_sft_then_rl_run_on_the_gpu(tmp_path):
    sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
    from test_hf_fleet import RUN

    run = tmp_path / "run"
    device = [f"learner.device={DEVICE}", f"inference.device={DEVICE}", f"sft.device={DEVICE}"]
    res = subprocess.run(
        [sys.executable, "-m", "rlfleet.cli", "train", "metaworld_quickstart_hf_oft_cpu", *RUN, *device]
        + [f"demos.cache_dir={tmp_path / 'cache'}", f"runner.logger.log_path={run}"],
        capture_output=True,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["updates"] >= 4


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _report(row: dict) -> None:
    print(json.dumps(row))
    path = Path(os.environ.get("RLFLEET_GPU_REPORT", "runs/gpu_hf_vla.jsonl"))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


REAL = {
    "hf_oft-paligemma3b": ({"name": "hf_oft", "backbone": "builtin:paligemma-3b-random"}, 7, 8, 224),
    "hf_pi0-paligemma3b": (
        {"name": "hf_pi0", "backbone": "builtin:paligemma-3b-random", "expert_width": 1024, "expert_mlp": 4096},
        7,
        50,
        224,
    ),
    "hf_oft-smolvlm256m": ({"name": "hf_oft", "backbone": "builtin:smolvlm-256m-random"}, 7, 8, 512),
}


@pytest.mark.timeout(600)  # building 3B random weights takes a while
@pytest.mark.parametrize("case", sorted(REAL))
def test_real_architecture_memory_latency_and_one_update(case):
    settings, action_dim, chunk, image = REAL[case]
    if DEVICE == "cpu" and "paligemma3b" in case:
        pytest.skip("3B on a CPU: GPU only")
    torch.manual_seed(0)
    t0 = time.perf_counter()
    p = make_policy({**settings, **LORA16, "max_text_len": 32}, 8, action_dim, chunk, image_size=image).to(DEVICE)
    p.eval()
    build_s = time.perf_counter() - t0
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    weights_gb = torch.cuda.memory_allocated() / 1e9 if DEVICE == "cuda" else float("nan")
    latency = {}
    for batch in [int(b) for b in os.environ.get("RLFLEET_GPU_BATCHES", "1,8,32").split(",")]:
        o = _obs(batch, image)
        p.act(o)  # warm-up
        _sync()
        times = []
        for _ in range(5):
            t = time.perf_counter()
            p.act(o)
            _sync()
            times.append(time.perf_counter() - t)
        latency[batch] = 1000 * statistics.median(times)
    act_peak_gb = torch.cuda.max_memory_allocated() / 1e9 if DEVICE == "cuda" else float("nan")
    # one learner update: evaluate (log-prob, entropy, value) at batch 8, PPO-shaped loss, Adam step
    p.train()
    opt = torch.optim.Adam([q for q in p.parameters() if q.requires_grad], lr=1e-5)
    o = _obs(8, image)
    with torch.no_grad():
        out = p.act(o)
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    _sync()
    t = time.perf_counter()
    logp, entropy, values = p.evaluate(o, out["actions"], {k: out[k] for k in p.extra_outputs})
    loss = -(torch.exp(logp - out["logprobs"]).mean()) - 0.01 * entropy.mean() + values.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    _sync()
    update_ms = 1000 * (time.perf_counter() - t)
    total, sent = p.element_counts()
    _report(
        {
            "case": case,
            "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
            "date": time.strftime("%Y-%m-%d"),
            "parameters": total,
            "sent_per_version": sent,
            "build_s": round(build_s, 1),
            "weights_gb": round(weights_gb, 2),
            "act_peak_gb": round(act_peak_gb, 2),
            "act_ms": {b: round(v, 1) for b, v in latency.items()},
            "update_ms_batch8": round(update_ms, 1),
            "update_peak_gb": round(torch.cuda.max_memory_allocated() / 1e9, 2) if DEVICE == "cuda" else None,
        }
    )
    assert torch.isfinite(loss)
