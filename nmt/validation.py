"""Validation during training: teacher-forced loss and perplexity, greedy BLEU/chrF, samples."""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from nmt.config import Config
from nmt.data import batch_indices
from nmt.layout import iter_batches
from nmt.logging_utils import RunLogger
from nmt.loss import label_smoothed_nll
from nmt.step import Precision
from nmt.tokenizer import Tokenizer


def validate(model: nn.Module, cfg: Config, tokenizer: Tokenizer, valid, valid_lines, device: torch.device,
             precision: Precision, log: RunLogger, step: int) -> dict:
    """Validation loss/ppl (teacher forcing) and greedy BLEU/chrF; logs samples. model: unwrapped."""
    was_training = model.training
    model.eval()
    loss_sum = nll_sum = torch.zeros((), device=device)
    n_tokens = 0
    order = batch_indices(valid.src_lens, valid.tgt_lens, cfg.data.batch_tokens, cfg.seed, 0)
    with torch.inference_mode(), precision.autocast():
        for batch in iter_batches(valid, order, tokenizer.specials, pin_memory=device.type == "cuda"):
            batch = batch.to(device)
            loss, nll = label_smoothed_nll(model(batch.src, batch.src_mask, batch.tgt_in), batch.tgt_out,
                                           cfg.train.label_smoothing, tokenizer.specials.pad)
            loss_sum, nll_sum, n_tokens = loss_sum + loss, nll_sum + nll, n_tokens + batch.n_tgt_tokens
    loss_v, nll_v = (loss_sum / n_tokens).item(), (nll_sum / n_tokens).item()
    metrics = {"loss": loss_v, "nll": nll_v, "ppl": math.exp(min(nll_v, 50.0))}
    if cfg.train.valid_bleu:
        metrics.update(_bleu(model, cfg, tokenizer, valid_lines, device, precision, log, step))
    model.train(was_training)
    return metrics


def _bleu(model, cfg: Config, tokenizer, valid_lines, device, precision: Precision, log: RunLogger, step: int) -> dict:
    """Greedy translations of the validation sources: BLEU, chrF, BP, length ratio and the
    degeneration report (nmt/degeneration.py: train.log line and TensorBoard scalars)."""
    from nmt.degeneration import degeneration, format_report, scalars
    from nmt.evaluate import corpus_metrics
    from nmt.fast import search_ops
    from nmt.torch_engine import TorchEngine
    from nmt.translate import translate_nbest

    src, ref = valid_lines
    n = cfg.train.valid_max_sentences or len(src)
    src, ref = src[:n], ref[:n]
    decode = dataclasses.replace(cfg.decode, beam_size=1, nbest=1, sampling="none", alignment=False,
                                 protect=cfg.data.protect, tgt_lang=cfg.data.tgt_lang if tokenizer.languages else None)
    engine = TorchEngine(model, tokenizer, decode, search_ops(device), autocast=precision.dtype)
    out = [r[0] for r in translate_nbest(engine, src, decode, warn=log.info)]
    hyps = [t.text for t in out]
    scores = corpus_metrics(hyps, ref, ("bleu", "chrf"), tokenize=cfg.train.valid_tokenize)
    report = degeneration(hyps, ref, src, [t.finished for t in out], tokenize=cfg.train.valid_tokenize)
    log.info(f"valid step {step} {format_report(report)}")
    k = min(cfg.train.num_samples, len(src))
    picks = sorted({i * len(src) // k for i in range(k)}) if k else []
    for j, i in enumerate(picks):
        log.info(f"sample {j + 1}/{len(picks)} (line {i + 1})\n  src: {src[i]}\n  ref: {ref[i]}\n  hyp: {hyps[i]}")
        log.text(f"valid/sample_{j + 1}", f"**src:** {src[i]}  \n**ref:** {ref[i]}  \n**hyp:** {hyps[i]}", step)
    bleu = scores["bleu"]
    return {"bleu": bleu["score"], "chrf": scores["chrf"]["score"], "bp": bleu["bp"], "len_ratio": bleu["ratio"],
            **scalars(report)}
