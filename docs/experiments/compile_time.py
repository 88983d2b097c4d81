"""Compile time and step time on CPU (BENCHMARKS.md "The training step compiled"): the base model (d512, 6+6,
FFN 2048, 8k vocabulary), 6 training steps of random batches of different shapes, one mode per process:

    for m in eager regional whole; do rm -rf /tmp/torchinductor_$USER; python3 docs/experiments/compile_time.py $m; done

regional = Transformer.compile_layers + nmt's compiled loss (train.compile); whole = torch.compile of the
whole model and, separately, nmt's compiled loss (2 graphs: close to, not the same as, the H200
experiment, which compiled model and F.cross_entropy in one function)."""
import sys, time, torch
from torch._dynamo.utils import counters
from nmt.config import ModelConfig
from nmt.model.transformer import Transformer
from nmt.training.loss import compiled_smoothed_nll
import torch.fx.experimental._config as fx_config
fx_config.use_duck_shape = False
mode = sys.argv[1]
torch.manual_seed(0)
cfg = ModelConfig(d_model=512, n_heads=8, layers=6, ffn_dim=2048, dropout=0.1, norm="post")
m = Transformer(cfg, 8000, 8000)
if mode == "regional":
    m.compile_layers(); fwd = m
elif mode == "whole":
    fwd = torch.compile(m, dynamic=True)
else:
    fwd = m
loss_fn = compiled_smoothed_nll() if mode != "eager" else None
from nmt.training.loss import label_smoothed_nll
loss_fn = loss_fn or label_smoothed_nll
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
times = []
for i, (B, S, T) in enumerate([(8, 21, 23), (6, 30, 28), (10, 17, 19), (8, 25, 22), (7, 26, 27), (9, 20, 24)]):
    src = torch.randint(4, 8000, (B, S)); mask = torch.ones(B, S, dtype=torch.bool); tgt = torch.randint(4, 8000, (B, T + 1))
    t0 = time.perf_counter()
    loss, _ = loss_fn(fwd(src, mask, tgt[:, :-1]), tgt[:, 1:], 0.1, 0)
    loss.backward(); opt.step(); opt.zero_grad()
    times.append(time.perf_counter() - t0)
print(f"{mode}: first step {times[0]:.1f} s, then {sum(times[1:])/5*1000:.0f} ms/step; graphs {counters['stats']['unique_graphs']}", flush=True)
