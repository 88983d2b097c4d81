"""nmt/protect.py: which spans are protected, masking, restoring, counting."""

from __future__ import annotations

import pytest

from nmt.protect import MAX_SPANS, PLACEHOLDERS, mask, mask_pair, restore


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
    src, tgt = mask_pair("Delete %s from <b>{0}</b>?", "¿Borrar %s de <b>{0}</b>?")
    assert src == "Delete <ph_0> from <ph_1><ph_2><ph_3>?"
    assert tgt == "¿Borrar <ph_0> de <ph_1><ph_2><ph_3>?"
    src, tgt = mask_pair("%s and %s", "%s y %s y %d")  # repeated spans pair up in order; unknown ones stay
    assert (src, tgt) == ("<ph_0> and <ph_1>", "<ph_0> y <ph_1> y %d")
    assert PLACEHOLDERS[3] == "<ph_3>"
