"""Validation during training: teacher-forced loss and perplexity, greedy BLEU/chrF, samples.

Each validation set (`nmt.data.batches.ValidSet`) is scored on its own, decoded into its own target
language with that language's BLEU tokenizer, its off-target outputs counted when the run has a
language identifier. Several sets give `NAME/loss`, `NAME/bleu`, ... (NAME = "es-en") and their
means under the plain names, which `train.metric` selects on.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from nmt.config import Config, SamplingConfig
from nmt.data.batches import ValidSet, batch_indices
from nmt.text.languages import target_languages
from nmt.layout import iter_batches
from nmt.training.logging_utils import RunLogger, format_stats
from nmt.training.loss import label_smoothed_nll
from nmt.training.step import Precision
from nmt.text.tokens import TokenizerLike


def validate(model: nn.Module, cfg: Config, tokenizer: TokenizerLike, valid, valid_sets: tuple[ValidSet, ...],
             device: torch.device, precision: Precision, log: RunLogger, step: int, langid=None) -> dict:
    """The metrics of every validation set (module docstring); model: unwrapped. valid: the encoded
    validation corpus (`nmt.data.batches.Data.valid`); langid: the run's LanguageIdentifier or None."""
    was_training = model.training
    model.eval()
    try:
        per_set = [_validate_set(model, cfg, tokenizer, valid, vs, device, precision, log, step, langid,
                                 _samples(cfg.train.num_samples, len(valid_sets)), len(valid_sets) > 1)
                   for vs in valid_sets]
    finally:
        model.train(was_training)
    return per_set[0] if len(per_set) == 1 else combine(valid_sets, per_set)


def _samples(num_samples: int, n_sets: int) -> int:
    """Samples shown per set: train.num_samples spread over the sets, at least one each (unless 0)."""
    return -(-num_samples // n_sets) if num_samples else 0


def combine(valid_sets: tuple[ValidSet, ...], per_set: list[dict]) -> dict:
    """`NAME/metric` for each set's metrics, then the mean of each metric every set has under its own
    name (`ppl`: exp of the mean `nll`)."""
    out: dict = {}
    for vs, metrics in zip(valid_sets, per_set):
        out.update({f"{vs.name}/{k}": v for k, v in metrics.items()})
    common = [k for k in per_set[0] if all(k in m for m in per_set)]
    means = {k: sum(m[k] for m in per_set) / len(per_set) for k in common}
    if "nll" in means:
        means["ppl"] = math.exp(min(means["nll"], 50.0))
    return {**means, **out}


def _validate_set(model, cfg: Config, tokenizer, valid, vs: ValidSet, device, precision: Precision, log: RunLogger,
                  step: int, langid, samples: int, named: bool) -> dict:
    """One set's loss/ppl and, with train.valid_bleu, BLEU/chrF and the degeneration report; `named`:
    log the set's own lines (several sets)."""
    metrics = _loss(model, cfg, tokenizer, valid, vs.pairs, device, precision)
    if cfg.train.valid_bleu:
        metrics.update(_bleu(model, cfg, tokenizer, vs, device, precision, log, step, langid, samples, named))
    if named:
        log.info(f"valid step {step} {vs.name} | {format_stats(metrics)}")
    return metrics


def _loss(model, cfg: Config, tokenizer, valid, pairs: range, device, precision: Precision) -> dict:
    """Teacher-forced loss, nll and ppl per target token over `pairs` of the encoded corpus `valid`."""
    loss_sum = nll_sum = torch.zeros((), device=device)
    n_tokens = 0
    order = [b + pairs.start for b in batch_indices(valid.src_lens[pairs.start:pairs.stop],
                                                     valid.tgt_lens[pairs.start:pairs.stop],
                                                     cfg.data.batch_tokens, cfg.seed, 0)]
    with torch.inference_mode(), precision.autocast():
        for batch in iter_batches(valid, order, tokenizer.specials, pin_memory=device.type == "cuda"):
            batch = batch.to(device)
            loss, nll = label_smoothed_nll(model(batch.src, batch.src_mask, batch.tgt_in), batch.tgt_out,
                                           cfg.train.label_smoothing, tokenizer.specials.pad)
            loss_sum, nll_sum, n_tokens = loss_sum + loss, nll_sum + nll, n_tokens + batch.n_tgt_tokens
    loss_v, nll_v = (loss_sum / n_tokens).item(), (nll_sum / n_tokens).item()
    return {"loss": loss_v, "nll": nll_v, "ppl": math.exp(min(nll_v, 50.0))}


def valid_tokenize(cfg: Config, tgt_lang: str) -> str:
    """The sacreBLEU tokenizer of validation BLEU into `tgt_lang`: train.valid_tokenize, or with `auto`
    the target language's (`nmt.evaluation.metrics.language_tokenize`; 13a for most languages)."""
    if cfg.train.valid_tokenize != "auto":
        return cfg.train.valid_tokenize
    from nmt.evaluation.metrics import language_tokenize

    return language_tokenize(tgt_lang)[0] or "13a"


def check_tokenize(cfg: Config, log) -> None:
    """Before training: a tokenizer that cannot work fails now (UserError), not at the first
    validation; `auto` falling back to `char` for a Japanese validation set says so once."""
    from nmt.evaluation.metrics import check_tokenize as check, language_tokenize

    if not cfg.train.valid_bleu:
        return
    if cfg.train.valid_tokenize != "auto":
        check(cfg.train.valid_tokenize)
        return
    for tgt in dict.fromkeys(cfg.data.langs(c)[1] for c in cfg.data.valid_corpora):
        note = language_tokenize(tgt)[1]
        if note:
            log(f"warning: validation into {tgt}: {note}")


def _bleu(model, cfg: Config, tokenizer, vs: ValidSet, device, precision: Precision, log: RunLogger, step: int,
          langid, samples: int, named: bool) -> dict:
    """Greedy translations of the set's sources into its target language: BLEU, chrF, BP, length ratio
    and the degeneration report (nmt/evaluation/degeneration.py: train.log line and TensorBoard scalars)."""
    from nmt.evaluation.degeneration import degeneration, format_report, scalars
    from nmt.evaluation.metrics import corpus_metrics
    from nmt.search.fast import search_ops
    from nmt.translation.torch_engine import TorchEngine
    from nmt.translation.translate import translate_nbest

    src, ref = vs.lines
    n = cfg.train.valid_max_sentences or len(src)
    src, ref = src[:n], ref[:n]
    decode = dataclasses.replace(cfg.decode, beam_size=1, nbest=1, sampling=SamplingConfig(), alignment=False,
                                 protect=cfg.data.protect,
                                 tgt_lang=vs.tgt_lang if target_languages(tokenizer).multilingual else None,
                                 src_lang=vs.src_lang)  # (a tokenizer without source-language tokens ignores it)
    engine = TorchEngine(model, tokenizer, decode, search_ops(device), autocast=precision.dtype)
    out = [r[0] for r in translate_nbest(engine, src, decode, warn=log.info)]
    hyps = [t.text for t in out]
    tokenize = valid_tokenize(cfg, vs.tgt_lang)
    scores = corpus_metrics(hyps, ref, ("bleu", "chrf"), tokenize=tokenize)
    report = degeneration(hyps, ref, src, [t.finished for t in out], tokenize=tokenize, identifier=langid,
                          lang=vs.tgt_lang)
    log.info(f"valid step {step}{' ' + vs.name if named else ''} {format_report(report)}")
    _log_samples(log, step, src, ref, hyps, samples, vs.name if named else None)
    bleu = scores["bleu"]
    return {"bleu": bleu["score"], "chrf": scores["chrf"]["score"], "bp": bleu["bp"], "len_ratio": bleu["ratio"],
            **scalars(report)}


def _log_samples(log: RunLogger, step: int, src, ref, hyps, k: int, name: str | None) -> None:
    """k sample translations spread over the set, in train.log and TensorBoard (`valid/[NAME/]sample_j`)."""
    k = min(k, len(src))
    picks = sorted({i * len(src) // k for i in range(k)}) if k else []
    where, tag = (f" {name}", f"valid/{name}/") if name else ("", "valid/")
    for j, i in enumerate(picks):
        log.info(f"sample {j + 1}/{len(picks)}{where} (line {i + 1})\n  src: {src[i]}\n  ref: {ref[i]}\n"
                 f"  hyp: {hyps[i]}")
        log.text(f"{tag}sample_{j + 1}", f"**src:** {src[i]}  \n**ref:** {ref[i]}  \n**hyp:** {hyps[i]}", step)
