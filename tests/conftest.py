"""Shared fixtures (shared helper functions are in helpers.py)."""

import os

import pytest
import torch

from helpers import make_tiny_checkpoint

if os.environ.get("PYTEST_XDIST_WORKER"):  # `pytest -n 2` (README "Test"): one torch thread per worker, 2 cores
    torch.set_num_threads(1)


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
