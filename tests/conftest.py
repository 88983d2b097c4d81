"""Shared fixtures (shared helper functions are in helpers.py)."""

import pytest
import torch

from helpers import make_tiny_checkpoint


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models run fastest on one torch thread (and the 2 cores are shared); restored afterwards.
    Test modules opt in with `pytestmark = pytest.mark.usefixtures("one_thread")`."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    """An untrained tiny checkpoint (`helpers.make_tiny_checkpoint`'s defaults), one per test module."""
    return make_tiny_checkpoint(str(tmp_path_factory.mktemp("ckpt") / "tiny.pt"))
