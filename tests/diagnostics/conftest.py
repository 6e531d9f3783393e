import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """The models here are tiny: one intra-op thread is as fast, and steadier on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
