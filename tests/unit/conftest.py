"""Unit tests run torch on one thread: their tensors are tiny, and extra intra-op threads only
add contention on a busy 2-core machine."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
