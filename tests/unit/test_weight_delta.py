"""Delta weight sync: only tensors changed since the puller's version travel; frozen ones never."""

import time

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import nn

from rlfleet.inference_server.weight_subscriber import WeightSubscriber, pull_weights
from rlfleet.learner.ingest import IngestQueue
from rlfleet.learner.service import LearnerServicer
from rlfleet.learner.weight_publisher import WeightPublisher, tensor_digest, tensor_digests
from rlfleet.policies.checkpoint_io import cpu_state_dict, load_tensors
from rlfleet.wire.gen import learner_pb2_grpc
from rlfleet.wire.grpc_server import make_channel, start_grpc_server


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 2))
    model.register_buffer("obs_mean", torch.zeros(8))
    model.register_buffer("count", torch.tensor(0.0))  # 0-dim buffers hash too
    for p in model[0].parameters():  # a frozen "backbone"
        p.requires_grad_(False)
    return model


class Learner:
    """The learner's side of publishing: digests that skip frozen tensors, as rlfleet.learner.main does."""

    def __init__(self, model: nn.Module, publisher: WeightPublisher):
        self.model, self.publisher = model, publisher
        self.frozen = frozenset(n for n, p in model.named_parameters() if not p.requires_grad)
        self.digests: dict[str, str] = {}
        self.version = 0

    def publish(self) -> None:
        tensors = cpu_state_dict(self.model)
        self.digests = tensor_digests(tensors, self.digests, self.frozen)
        self.publisher.publish(self.version, st_save(tensors), self.digests)
        self.version += 1


def train_step(model: nn.Module) -> None:
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.01)


def test_digest_tells_dtype_shape_and_content_apart():
    a = torch.arange(6, dtype=torch.float32)
    assert tensor_digest(a) == tensor_digest(a.clone())
    assert tensor_digest(a) != tensor_digest(a.reshape(2, 3))
    assert tensor_digest(a) != tensor_digest(a.double())
    b = a.clone()
    b[3] += 1e-6
    assert tensor_digest(a) != tensor_digest(b)
    assert tensor_digest(torch.zeros(0)) != tensor_digest(torch.zeros(0, 2))


def test_frozen_tensors_are_not_rehashed():
    tensors = {"w": torch.ones(3), "frozen": torch.ones(3)}
    first = tensor_digests(tensors)
    tensors["frozen"] = torch.zeros(3)  # would change the digest if it were hashed again
    again = tensor_digests(tensors, first, frozenset({"frozen"}))
    assert again["frozen"] == first["frozen"]


def test_delta_holds_only_changed_tensors():
    pub = WeightPublisher()
    learner = Learner(make_model(0), pub)
    learner.publish()  # v0
    train_step(learner.model)
    learner.publish()  # v1: the two trainable layers changed
    delta = pub.delta_since(0)
    assert delta.base_version == 0 and delta.version == 1
    assert set(st_load(delta.data)) == {"2.weight", "2.bias", "4.weight", "4.bias"}
    assert len(delta.data) < len(pub.current().data)
    learner.model.obs_mean.fill_(3.0)
    learner.publish()  # v2: only the buffer changed
    assert set(st_load(pub.delta_since(1).data)) == {"obs_mean"}
    assert set(st_load(pub.delta_since(0).data)) == {"2.weight", "2.bias", "4.weight", "4.bias", "obs_mean"}
    assert st_load(pub.delta_since(2).data) == {}
    # bases it cannot vouch for get the full weights
    for base in (-1, 3, 99):
        assert pub.delta_since(base).base_version == -1
    assert pub.delta_since(0) is pub.delta_since(0)  # cached for the current version


def test_publish_without_digests_disables_deltas():
    pub = WeightPublisher()
    pub.publish(0, st_save({"w": torch.ones(2)}))
    pub.publish(1, st_save({"w": torch.zeros(2)}))
    assert pub.delta_since(0).base_version == -1


def test_partial_load_checks_names_and_shapes():
    model = make_model(0)
    with pytest.raises(ValueError, match="unexpected"):
        load_tensors(model, {"nope": torch.zeros(1)}, partial=True)
    with pytest.raises(ValueError, match="shape mismatch"):
        load_tensors(model, {"4.bias": torch.zeros(3)}, partial=True)
    with pytest.raises(ValueError, match="missing"):
        load_tensors(model, {"4.bias": torch.zeros(2)}, partial=False)
    load_tensors(model, {"4.bias": torch.full((2,), 7.0)}, partial=True)
    assert torch.equal(model[4].bias, torch.full((2,), 7.0))


@pytest.fixture
def served():
    pub = WeightPublisher()
    servicer = LearnerServicer("runner: {}\n", "run", IngestQueue(4), pub, chunk_bytes=1024)
    server, port = start_grpc_server(
        "127.0.0.1",
        0,
        [lambda s: learner_pb2_grpc.add_LearnerServiceServicer_to_server(servicer, s)],
        ["rlfleet.v1.LearnerService"],
        max_workers=8,
    )
    channel = make_channel(f"127.0.0.1:{port}")
    yield pub, channel
    channel.close()
    server.stop(grace=0)


def wait_for(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("delta", [True, False])
def test_subscriber_follows_the_learner_exactly(served, delta):
    pub, channel = served
    learner = Learner(make_model(0), pub)
    learner.publish()
    stub = learner_pb2_grpc.LearnerServiceStub(channel)
    initial = pull_weights(stub)
    replica = make_model(1)  # different weights until the first load
    load_tensors(replica, st_load(initial.data))
    sub = WeightSubscriber(channel, initial, "inference-0", delta=delta).start()
    try:
        full_size = len(pub.current().data)
        for step in range(3):
            train_step(learner.model)
            if step == 1:
                learner.model.obs_mean.fill_(1.5)
            learner.publish()
            want = learner.version - 1
            assert wait_for(lambda want=want: sub.known == want)
        update = sub.take()  # updates not taken in between were merged, none lost
        assert update.version == learner.version - 1 and update.complete is (not delta)
        load_tensors(replica, update.tensors, partial=not update.complete)
        for name, t in learner.model.state_dict().items():
            assert torch.equal(replica.state_dict()[name], t), name
        if delta:  # the frozen first layer never travelled again
            assert "0.weight" not in update.tensors
            assert sub.bytes_received < 3 * full_size * 0.9
        else:
            assert sub.bytes_received == 3 * full_size
    finally:
        sub.stop()
