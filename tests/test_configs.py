"""Every recipe in configs/ loads and validates (hub datasets are not contacted)."""

from __future__ import annotations

import glob
import os

import pytest

from nmt.config import Config, load_config

from helpers import ROOT

RECIPES = sorted(glob.glob(os.path.join(ROOT, "configs", "*.yaml")))


def test_recipes_exist():
    names = {os.path.basename(p) for p in RECIPES}
    assert {"quickstart.yaml", "bible-es-en.yaml", "iwslt14-de-en.yaml", "wmt14-en-de-base.yaml"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=os.path.basename)
def test_recipe_loads_and_validates(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # data paths are relative to the repository root
    with open(path, encoding="utf-8") as f:  # the gettext corpus is built at run time (data/gettext/README.md)
        built = "data/gettext/" not in f.read() or os.path.isfile(os.path.join(ROOT, "data", "gettext", "manifest.json"))
    source = load_config(path, check_files=False).train.init_from  # a fine-tuning source is made by a command
    cfg = load_config(path, check_files=built and (source is None or os.path.isfile(source)))
    assert isinstance(cfg, Config)
    assert cfg.name == os.path.splitext(os.path.basename(path))[0]
    with open(path, encoding="utf-8") as f:
        first = f.readline()
    assert first.startswith("#"), "each recipe opens with a comment"
    assert "nmt train --config configs/" + os.path.basename(path) in open(path, encoding="utf-8").read()


def test_benchmark_recipes_match_published_baselines():
    base = load_config(os.path.join(ROOT, "configs", "wmt14-en-de-base.yaml"))
    m = base.model
    assert (m.d_model, m.n_heads, m.layers, m.ffn_dim, m.norm, m.dropout) == (512, 8, 6, 2048, "post", 0.1)
    assert base.train.label_smoothing == 0.1 and base.train.warmup_steps == 4000
    iwslt = load_config(os.path.join(ROOT, "configs", "iwslt14-de-en.yaml"))
    assert (iwslt.model.d_model, iwslt.model.n_heads, iwslt.model.ffn_dim, iwslt.model.dropout) == (512, 4, 1024, 0.3)
    assert iwslt.data.train.kind == "hf" and base.data.train.kind == "hf"
