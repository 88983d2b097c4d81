"""The torch floor in pyproject.toml is a version whose API the code uses.

The newest torch APIs nmt calls, with the release that added each (PyTorch's docs and release
notes); the floor must be at least the newest of them, and each must exist on the installed torch.
A new call to a newer API belongs in this table (and may raise the floor)."""

from __future__ import annotations

import inspect
import os
import re

import torch

from helpers import ROOT


NEWEST_APIS = {  # what nmt calls -> (torch release that added it, where nmt calls it)
    "torch.nn.utils.get_total_norm": ((2, 6), "nmt/training/step.py"),
    "fused=True for Adam/AdamW on CPU": ((2, 4), "nmt/training/optim.py"),
    "torch.distributed.init_process_group(device_id=...)": ((2, 3), "nmt/training/distributed.py"),
    "torch.amp.GradScaler(device)": ((2, 3), "nmt/training/step.py"),
    "torch.load(mmap=True)": ((2, 1), "nmt/model/checkpoint.py"),
}


def floor() -> tuple[int, int]:
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        m = re.search(r'"torch>=(\d+)\.(\d+)', f.read())
    assert m, "pyproject.toml declares no torch floor"
    return int(m.group(1)), int(m.group(2))


def test_the_torch_floor_covers_every_api_the_code_uses():
    newest = max(version for version, _ in NEWEST_APIS.values())
    assert floor() >= newest, f"pyproject.toml allows torch {floor()} but the code needs {newest}"


def test_each_listed_api_is_used_where_listed_and_exists_here():
    for api, (_, path) in NEWEST_APIS.items():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            code = f.read()
        key = {"fused=True for Adam/AdamW on CPU": '"fused"', "torch.amp.GradScaler(device)": "GradScaler(",
               "torch.load(mmap=True)": "mmap=mmap", "torch.distributed.init_process_group(device_id=...)": "device_id="
               }.get(api, api.split(".")[-1])
        assert key in code, f"{api} is no longer used in {path}: update NEWEST_APIS"
    assert callable(torch.nn.utils.get_total_norm)
    assert "device_id" in inspect.signature(torch.distributed.init_process_group).parameters
    assert "mmap" in inspect.signature(torch.load).parameters
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], fused=True)  # CPU fused kernels


def _block_after(text: str, heading: str) -> list[str]:
    """The command lines of the first ```bash block after `heading` in README.md."""
    part = text[text.index(heading):]
    block = part[part.index("```bash") + len("```bash"):]
    return [line.strip() for line in block[:block.index("```")].splitlines() if line.strip()]


def test_ci_installs_and_tests_exactly_as_the_readme_says():
    """CI is what a newcomer gets: every command of README.md's Install and Test blocks is in .ci/run (a fresh
    virtual environment, torch first, then the package with tests/constraints.txt), in the same order."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    install = _block_after(readme, "## Install")
    assert install[0].startswith("python3 -m venv ")
    wanted = install[1:] + _block_after(readme, "## Test")  # the venv's path is CI's own (a new temporary one)
    assert "pip install -e \".[dev,ct2,onnx]\" -c tests/constraints.txt" in wanted
    at = [next((i for i, line in enumerate(ci) if line.replace("pip install -q ", "pip install ") == cmd
                or (cmd.startswith("python3 -m venv") and line.startswith("python3 -m venv"))), None) for cmd in wanted]
    missing = [cmd for cmd, i in zip(wanted, at) if i is None]
    assert not missing, f".ci/run lacks README commands: {missing}"
    assert at == sorted(at), "README's commands run in another order in .ci/run"


def test_constraints_pin_every_dev_tool_and_leave_torch_to_the_user():
    with open(os.path.join(ROOT, "tests", "constraints.txt"), encoding="utf-8") as f:
        pins = dict(line.strip().split("==") for line in f if "==" in line)
    names = {name.lower().replace("_", "-") for name in pins}
    assert {"pytest", "ruff", "transformers", "selenium", "ctranslate2", "sacrebleu", "sentencepiece", "onnx",
            "onnxruntime", "onnxscript"} <= names
    assert not {"torch", "triton"} & names, "torch is installed first, CPU or CUDA build: not pinned here"


def test_the_fast_lane_is_registered_documented_and_ci_runs_everything(pytestconfig):
    """`slow` is a registered marker (with --strict-markers a misspelt one fails); README.md "Test" gives the
    fast lane `python3 -m pytest -m "not slow"` for the edit-test loop outside the block CI runs, and CI's
    pytest runs the whole suite (no -m, -k or --deselect)."""
    assert pytestconfig.inipath.name == "pyproject.toml"
    assert "--strict-markers" in pytestconfig.getini("addopts")
    assert any(m.startswith("slow:") for m in pytestconfig.getini("markers"))
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    section = readme[readme.index("## Test"):]
    section = section[:section.index("\n## ")]
    assert 'python3 -m pytest -m "not slow"' in section
    ci_block = _block_after(readme, "## Test")
    assert "python3 -m pytest" in ci_block and not any("not slow" in line for line in ci_block)
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        (pytest_line,) = [line.strip() for line in f if line.strip().startswith("python3 -m pytest")]
    assert not {"-m", "-k", "--deselect"} & set(pytest_line.split()[3:]), pytest_line  # after `python3 -m pytest`
