"""nmt/text/protect.py: which spans are protected, masking, restoring, counting."""

from __future__ import annotations

import pytest

import re

from nmt.text.protect import MAX_SPANS, PLACEHOLDERS, mask, mask_pair, restore
from nmt.config import config_from_dict
from helpers import ENV, config_errors, one_line_error


@pytest.mark.parametrize("text,spans", [
    ("Deleted %d files in %s", ["%d", "%s"]),
    ("%1$s and %2$d, %-10s %5.2f %lld %% %@", ["%1$s", "%2$d", "%-10s", "%5.2f", "%lld", "%%", "%@"]),
    ("Hello %(name)s, you have %(count)d", ["%(name)s", "%(count)d"]),
    ("Hello {0}, {name} owes {1:.2f} {} {user.name}", ["{0}", "{name}", "{1:.2f}", "{}", "{user.name}"]),
    ('<b>Save</b> <br/> <a href="x.html">link</a>', ["<b>", "</b>", "<br/>", '<a href="x.html">', "</a>"]),
    ("Fish &amp; chips &#39;n&#x27; &lt;3", ["&amp;", "&#39;", "&#x27;", "&lt;"]),
    ("50% off, 100% sure; a < b > c", []),  # plain percentages and comparisons are text
])
def test_spans(text, spans):
    masked, found = mask(text)
    assert found == spans
    assert masked.count("<ph_") == len(spans)
    assert restore(masked, found).text == text and restore(masked, found).exact


def test_extra_pattern_and_limit():
    masked, spans = mask("call ACME_01 at $HOME", r"\$[A-Z]+|ACME_\d+")
    assert spans == ["ACME_01", "$HOME"] and masked == "call <ph_0> at <ph_1>"
    many = " ".join(f"{{{k}}}" for k in range(MAX_SPANS + 3))
    masked, spans = mask(many)
    assert len(spans) == MAX_SPANS and masked.endswith("{16} {17} {18}")


def test_restore_counts_drops_duplicates_and_never_invents():
    masked, spans = mask("Open %s in {0}")
    assert masked == "Open <ph_0> in <ph_1>"
    assert restore("Abrir <ph_0> en <ph_1>", spans).exact
    assert restore("Abrir <ph_1> en <ph_0>", spans).text == "Abrir {0} en %s"  # reordered: still exact
    dropped = restore("Abrir en <ph_1>", spans)
    assert dropped.text == "Abrir en {0}" and not dropped.exact
    twice = restore("<ph_0> <ph_0> <ph_1>", spans)
    assert twice.text == "%s %s {0}" and not twice.exact
    invented = restore("Abrir <ph_0> <ph_7> en <ph_1>", spans)
    assert invented.text == "Abrir %s en {0}" and not invented.exact


def test_a_literal_placeholder_in_the_input_is_protected_too():
    masked, spans = mask("see <ph_0> and %s")
    assert spans == ["<ph_0>", "%s"] and restore(masked, spans).text == "see <ph_0> and %s"


def test_mask_pair_uses_the_same_placeholder_for_the_same_span():
    """Training pairs: the same placeholder on both sides; numbers drawn per pair (not 0, 1, 2 in
    order: the model must copy, not count), reproducibly, covering every placeholder."""
    src, tgt = mask_pair("Delete %s from <b>{0}</b>?", "¿Borrar %s de <b>{0}</b>?")
    k = [int(x) for x in re.findall(r"<ph_(\d+)>", src)]
    assert len(set(k)) == 4 and src == "Delete <ph_{}> from <ph_{}><ph_{}><ph_{}>?".format(*k)
    assert tgt == "¿Borrar <ph_{}> de <ph_{}><ph_{}><ph_{}>?".format(*k)
    assert mask_pair("Delete %s from <b>{0}</b>?", "x") == (src, "x")  # the same pair masks the same way
    src, tgt = mask_pair("%s and %s", "%s y %s y %d")  # repeated spans pair up in order; unknown ones stay
    a, b = re.findall(r"<ph_\d+>", src)
    assert tgt == f"{a} y {b} y %d"
    seen = {int(x) for i in range(300) for x in re.findall(r"<ph_(\d+)>", mask_pair(f"{i} %s {{0}}", "")[0])}
    assert seen == set(range(len(PLACEHOLDERS)))
    masked, spans = mask("a %s b", numbers=[7])
    assert masked == "a <ph_7> b" and restore("<ph_7>", spans).exact and not restore("<ph_0>", spans).exact


# --------------------------------------------------------------------------- training with data.protect

import os
import random
import subprocess
import sys

from helpers import NOUNS, VERBS, make_pairs, tiny_config_dict
from helpers import ROOT



def with_spans(pairs: list[tuple[str, str]], seed: int) -> list[tuple[str, str]]:
    """Software-string versions of synthetic pairs: a noun becomes {0} (it moves with the reordering
    rule: "el {0} rojo" -> "the red {0}"), the last phrase becomes %s, the verb gets <b> ... </b>,
    "y"/"and" becomes &amp;."""
    rng = random.Random(seed)
    out = []
    for src, tgt in pairs:
        s, t = src.split(), tgt.split()
        if rng.random() < 0.5 and s.count(s[1]) == 1 and t.count(NOUNS[s[1]]) == 1:  # s[1]: the first noun
            t[t.index(NOUNS[s[1]])], s[1] = "{0}", "{0}"
        if rng.random() < 0.4:  # the last phrase (from its article to the end)
            s = s[: max(i for i, w in enumerate(s) if w in ("el", "la"))] + ["%s"]
            t = t[: max(i for i, w in enumerate(t) if w == "the")] + ["%s"]
        if rng.random() < 0.5:
            i = next(i for i, w in enumerate(s) if w in VERBS)
            j = next(j for j, w in enumerate(t) if w == VERBS[s[i]])
            s[i], t[j] = f"<b> {s[i]} </b>", f"<b> {t[j]} </b>"
        out.append((" ".join(s).replace(" y ", " &amp; "), " ".join(t).replace(" and ", " &amp; ")))
    return out


@pytest.mark.slow
def test_training_with_data_protect_restores_the_spans(tmp_path):
    """A model trained with data.protect copies the placeholders: translating held-out software strings
    with --protect gives back every span exactly once on >= 99% of the lines that have spans."""
    raw = tiny_config_dict(str(tmp_path), max_steps=600, valid_every=300)
    for split, n, seed in (("train", 3000, 0), ("valid", 100, 1), ("test", 200, 2)):
        pairs = with_spans(make_pairs(n, seed), seed)
        for side, col in (("src", 0), ("tgt", 1)):
            path = str(tmp_path / f"{split}.{side}")
            with open(path, "w", encoding="utf-8") as f:
                f.write("".join(p[col] + "\n" for p in pairs))
            raw["data"][split][side] = path
    raw["data"]["protect"] = True
    raw["data"]["tokenizer"]["vocab_size"] = 120  # every word and placeholder (the word model: spans are words here)
    from nmt.config import config_from_dict
    from nmt.train import train

    cfg = config_from_dict(raw)
    result = train(cfg, quiet=True)
    assert result["best"] >= 90  # validation BLEU (translated with the placeholders protected): it learned the task
    ckpt = os.path.join(cfg.run_dir, "checkpoints", "best.pt")
    r = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", ckpt, "-i", raw["data"]["test"]["src"],
                        "--protect", "--beam", "1"], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert r.returncode == 0, r.stderr
    report = [x for x in r.stderr.splitlines() if x.startswith("protect:")]
    n_exact, n_lines = map(int, report[0].split()[1::2][:2])
    src_lines = open(raw["data"]["test"]["src"], encoding="utf-8").read().splitlines()
    assert n_lines == sum(bool(mask(x)[1]) for x in src_lines) > 100
    assert n_exact >= 0.99 * n_lines, report
    hyps = r.stdout.splitlines()
    assert len(hyps) == len(src_lines)
    for src, hyp in zip(src_lines, hyps):  # restored spans are the source's, verbatim
        assert sorted(mask(hyp)[1]) == sorted(mask(src)[1]) or "<ph_" not in hyp


def test_injected_placeholders_sit_at_aligned_positions():
    """data.protect_inject: a pair without spans gets the same placeholders on both sides, on words that
    occur once, identically, on each side (names, numbers), else at the start or the end; pairs with
    spans are masked as before; the same pair always gets the same placeholders."""
    import random as rnd

    src, tgt = "Y Israel fue a Dan con 12 hombres.", "And Israel went to Dan with 12 men."
    got = mask_pair(src, tgt, inject=1.0)
    assert got == mask_pair(src, tgt, inject=1.0)
    ks = re.findall(r"<ph_\d+>", got[0])
    assert 1 <= len(ks) <= 3 and sorted(ks) == sorted(re.findall(r"<ph_\d+>", got[1]))
    for ph in ks:  # each placeholder replaced the same word on both sides
        word = [w for w in ("Israel", "Dan", "12") if w not in got[0]]
        assert word and all(w not in got[1] for w in word)
    plain = mask_pair("Y dijo Dios: Sea la luz.", "God said, Let there be light.", inject=1.0)
    ph = re.findall(r"<ph_\d+>", plain[0])
    assert len(ph) == 1 and (plain[0].startswith(ph[0]) == plain[1].startswith(ph[0]))
    assert plain[0].replace(ph[0], "").strip() == "Y dijo Dios: Sea la luz."
    assert mask_pair("Y dijo Dios.", "God said.", inject=0.0) == ("Y dijo Dios.", "God said.")
    assert mask_pair("Borrar %s", "Delete %s", inject=1.0) == mask_pair("Borrar %s", "Delete %s")
    share = sum("<ph_" in mask_pair(f"frase {i}", f"sentence {i + 1000}", inject=0.3)[0] for i in range(2000)) / 2000
    assert 0.25 < share < 0.35
    del rnd


@pytest.mark.parametrize("beam", [1, 3])
def test_the_search_restores_every_span_even_untrained(tmp_path, beam):
    """--protect constrains the search: an untrained model (which copies nothing) still gives back every
    span of its source exactly once in every line it ends before the length limit (before issue 25:
    placeholders were dropped, repeated or invented)."""
    import torch

    from helpers import make_pairs, make_tiny_checkpoint
    from nmt.config import decode_config
    from nmt.layout import EOS_ID
    from nmt.text.protect import placeholder_ids
    from nmt.translation.torch_engine import TorchEngine
    from nmt.translation.translate import translate_chunk

    engine = TorchEngine.load(make_tiny_checkpoint(str(tmp_path / "tiny.pt"), symbols=PLACEHOLDERS), "cpu", fast=False)
    old = engine.model.output_proj
    engine.model.output_proj = torch.nn.Linear(old.in_features, old.out_features)  # biases: outputs end, and
    with torch.no_grad():  # placeholders (any of them, e.g. "<ph_3>" or "▁<ph_3>") are likely
        engine.model.output_proj.weight.copy_(old.weight)
        engine.model.output_proj.bias.zero_()
        engine.model.output_proj.bias[EOS_ID] = 3.0
        engine.model.output_proj.bias[list(placeholder_ids(engine.tokenizer)[1])] = 2.0
    lines = [f"{s} %s" if i % 3 == 0 else f"<b> {s} </b> {{0}}" if i % 3 == 1 else f"{s} &amp; %d"
             for i, (s, _) in enumerate(make_pairs(30, 21))]  # (spaces: this word model has no "<ph_0>el")
    decode = decode_config(engine.decode, dict(protect=True, beam_size=beam, max_len_a=2.0, max_len_b=12))
    results = translate_chunk(engine, lines, decode)
    free = translate_chunk(engine, lines, decode_config(decode, dict(protect=False)))
    assert sum(bool(r.protected) for r in free) <= 3  # unconstrained: spans dropped, repeated, invented
    ended = [r for r in results if r.finished]
    assert len(ended) >= 10
    assert all(r.protected for r in ended), [r.text for r in ended if not r.protected]
    for line, r in zip(lines, results):
        if r.finished:
            assert sorted(mask(r.text)[1]) == sorted(mask(line)[1])


# --------------------------------------------------------------------------- protect_pattern needs protect

@pytest.mark.slow
def test_protect_pattern_without_protect_is_refused(ckpt, tmp_path):
    """--protect-pattern without --protect was silently unused, and so was the config key."""
    proc = subprocess.run([sys.executable, "-m", "nmt", "translate", "-c", ckpt, "--protect-pattern", "casa"],
                          input="la casa\n", capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
    one_line_error(proc, 2, "nmt translate: error: 'decode.protect_pattern' (--protect-pattern) is set but "
                   "'decode.protect' (--protect) is false")
    raw = tiny_config_dict(str(tmp_path))
    raw["decode"]["protect_pattern"] = "casa"
    (err,) = config_errors(raw)
    assert "'decode.protect_pattern'" in err
    raw["decode"]["protect"] = True
    config_from_dict(raw)


def test_an_empty_match_protects_nothing_and_patterns_that_make_one_or_hold_a_global_flag_are_refused(tmp_path):
    """`--protect-pattern '\\b'` took all 16 placeholders for empty spans, so `%s` and `{0}` were not protected (exit 0);
    `(?i)dios` passed the check and failed with a traceback (the pattern is joined into a group)."""
    from helpers import tiny_config_dict

    assert mask("uno %s {0}", r"(?=D)") == ("uno <ph_0> <ph_1>", ["%s", "{0}"])
    assert mask_pair("uno %s", "one %s", r"(?=D)")[0].count("<ph_") == 1
    raw = tiny_config_dict(str(tmp_path))
    raw["decode"]["protect"] = True
    for given, problem in [(r"\b", "it matches the empty string"), ("(?<= )", "it matches the empty string"),
                           ("(?i)dios", "write a flag as a group, e.g. (?i:word)")]:
        raw["decode"]["protect_pattern"] = given
        (err,) = config_errors(raw, check_files=False)
        assert problem in err, err
    raw["decode"]["protect_pattern"] = "(?i:dios)"
    config_from_dict(raw, check_files=False)


def test_a_glossary_term_is_looked_for_with_the_spans_put_back():
    """`--glossary-constrain missing --protect` with the target `>`: the free output's `<ph_0>` counted as holding it,
    so the line was not searched again and came out without `>` (exit 0)."""
    from nmt.translation.line_terms import LineTerms

    def terms(spans):
        return LineTerms([[[1]]], [[False]], [], [[">"]], False, "missing", None, None, spans)
    assert not terms([["%s"]]).held(0, "mayor <ph_0>") and terms([["%s"]]).held(0, "> <ph_0>")
    assert terms([[]]).held(0, "mayor <ph_0>")  # (no spans: the text as it is)
