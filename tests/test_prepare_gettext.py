"""Tests for scripts/prepare_gettext.py on a fake locale tree of .mo files written here.

The .mo writer below follows the GNU gettext manual ("The Format of GNU MO Files") and
CPython's Tools/i18n/msgfmt.py: entries sorted by msgid, two tables of (length, offset)
records, NUL-terminated strings. Like msgfmt, it leaves fuzzy entries out (a .mo file has
no fuzzy flag: what a catalog marks fuzzy never reaches the corpus).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "prepare_gettext.py"
SYSTEM_LOCALE = Path("/usr/share/locale")


def _load_module():
    spec = importlib.util.spec_from_file_location("prepare_gettext", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["prepare_gettext"] = module  # dataclasses look the module up
    spec.loader.exec_module(module)
    return module


pg = _load_module()
HEADER = "Content-Type: text/plain; charset={charset}\nPlural-Forms: nplurals=2; plural=(n != 1);\n"


def write_mo(path: Path, entries: list[tuple], charset: str = "UTF-8", order: str = "<") -> None:
    """Compile entries (msgid, msgstr[, "fuzzy"]) to a .mo file, as msgfmt does.

    msgid may carry a context ("ctxt\\x04msgid") or a plural ("one\\x00many", with msgstr
    "form0\\x00form1"). The header entry is added; fuzzy entries are left out.
    """
    messages = {b"": HEADER.format(charset=charset).encode(charset)}
    for entry in entries:
        if len(entry) == 3 and entry[2] == "fuzzy":
            continue
        messages[entry[0].encode(charset)] = entry[1].encode(charset)
    keys = sorted(messages)
    ids = strs = b""
    records = []
    for key in keys:
        records.append((len(ids), len(key), len(strs), len(messages[key])))
        ids += key + b"\0"
        strs += messages[key] + b"\0"
    key_start = 7 * 4 + 16 * len(keys)
    value_start = key_start + len(ids)
    table = []
    for o1, l1, _, _ in records:
        table += [l1, o1 + key_start]
    for _, _, o2, l2 in records:
        table += [l2, o2 + value_start]
    head = struct.pack(order + "7I", 0x950412DE, 0, len(keys), 7 * 4, 7 * 4 + 8 * len(keys), 0, 0)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(head + struct.pack(order + f"{len(table)}I", *table) + ids + strs)


LONG = "word " * 45  # 225 characters: over MAX_EN_CHARS
GENERATED = 400  # messages "Generated message N" (so that dev and test are not empty)

CATALOGS = {
    ("es", "coreutils"): [
        ("Open file", "Abrir archivo"),
        ("%d file\x00%d files", "%d archivo\x00%d archivos"),  # plural: left out
        ("Empty translation", ""),  # empty: left out
        ("Fuzzy one", "Difusa", "fuzzy"),  # fuzzy: not in the .mo
        ("cannot read /etc/passwd", "no se puede leer /etc/passwd"),  # path
        ("see ~/notes", "vea ~/notes"),  # path
        ("Path C:\\temp", "Ruta C:\\temp"),  # path
        ("Visit https://example.org now", "Visite https://example.org ya"),  # URL
        ("%s: %s", "%s: %s"),  # only format codes
        ("...", "..."),  # only punctuation
        (LONG, "palabra"),  # too long
        ("Line one\n   line two\t", "Línea uno\nlínea dos"),  # one line
        ("_Save", "_Guardar"),  # GTK mnemonic
        ("Close", "Cerrar"),
        ("Print", "Imprimirlo"),
        ("menu\x04Quit", "Salir"),  # context
        ("Bell\x07ring", "Campana\x07suena"),  # control character
        *((f"Generated message {i}", f"Mensaje generado {i}") for i in range(GENERATED)),
    ],
    ("es", "tar"): [
        ("Close", "Cierre"),  # conflict: 2 votes for Cerrar win
        ("Print", "Imprimir"),  # tie 1:1 -> the smaller string (not the first read)
        ("Open file", "Abrir archivo"),  # duplicate
        ("Quit", "Salir"),
    ],
    ("es", "gtk30"): [("Close", "Cerrar"), ("&Help", "Ay&uda")],
    ("es", "not-listed-domain"): [("Unlisted", "No listado")],  # not in PACKAGES: never read
    ("de", "coreutils"): [
        ("Open file", "Datei öffnen"),
        ("Close", "Schließen"),
        ("Grüße", "Grüße"),  # Latin-1 catalog
        *((f"Generated message {i}", f"Erzeugte Nachricht {i}") for i in range(0, GENERATED, 2)),
    ],
    ("ja", "gtk30"): [
        ("_Save", "保存(_S)"),
        ("Open file", "ファイルを開く"),
        ("Close", "閉じる"),
        *((f"Generated message {i}", f"生成メッセージ {i}") for i in range(0, GENERATED, 4)),
    ],
}
CHARSETS = {("de", "coreutils"): "ISO-8859-1"}
ORDERS = {("ja", "gtk30"): ">"}  # a big-endian catalog

EXPECTED = {  # every kept pair, after normalisation and conflict resolution
    "es": {"Open file": "Abrir archivo", "Line one line two": "Línea uno línea dos", "Save": "Guardar",
           "Close": "Cerrar", "Print": "Imprimir", "Quit": "Salir", "Help": "Ayuda",
           **{f"Generated message {i}": f"Mensaje generado {i}" for i in range(GENERATED)}},
    "de": {"Open file": "Datei öffnen", "Close": "Schließen", "Grüße": "Grüße",
           **{f"Generated message {i}": f"Erzeugte Nachricht {i}" for i in range(0, GENERATED, 2)}},
    "ja": {"Save": "保存", "Open file": "ファイルを開く", "Close": "閉じる",
           **{f"Generated message {i}": f"生成メッセージ {i}" for i in range(0, GENERATED, 4)}},
}
LANGS = ("es", "de", "ja")


@pytest.fixture(scope="module")
def locale_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("locale")
    for (lang, domain), entries in CATALOGS.items():
        write_mo(pg.catalog_path(root, lang, domain), entries, CHARSETS.get((lang, domain), "UTF-8"),
                 ORDERS.get((lang, domain), "<"))
    return root


def run(locale_dir: Path, out: Path, *extra: str) -> int:
    return pg.main(["--locale-dir", str(locale_dir), "--no-install", "--out", str(out),
                    "--langs", ",".join(LANGS), *extra])


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")[:-1]


def read_pairs(out: Path, split: str, lang: str) -> list[tuple[str, str]]:
    en, xx = lines(out / f"{split}.en-{lang}.en"), lines(out / f"{split}.en-{lang}.{lang}")
    assert len(en) == len(xx)
    return list(zip(en, xx))


@pytest.fixture(scope="module")
def built(locale_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    assert run(locale_dir, out) == 0
    return out


def test_read_mo_entries(locale_dir):
    entries = pg.read_mo(pg.catalog_path(locale_dir, "es", "coreutils"))
    assert entries[0].msgid == "" and "charset=UTF-8" in entries[0].msgstr  # header first (sorted)
    by_id = {e.msgid: e for e in entries}
    assert by_id["%d file"].plural and by_id["%d file"].msgstr == "%d archivo"
    assert by_id["Quit"].context == "menu" and by_id["Quit"].msgstr == "Salir"
    assert "Fuzzy one" not in by_id
    de = {e.msgid: e.msgstr for e in pg.read_mo(pg.catalog_path(locale_dir, "de", "coreutils"))}
    assert de["Grüße"] == "Grüße"  # decoded as ISO-8859-1
    ja = {e.msgid: e.msgstr for e in pg.read_mo(pg.catalog_path(locale_dir, "ja", "gtk30"))}
    assert ja["_Save"] == "保存(_S)"  # big-endian


def test_read_mo_rejects_garbage(tmp_path):
    bad = tmp_path / "bad.mo"
    bad.write_bytes(b"not a catalog at all")
    with pytest.raises(ValueError, match="bad magic"):
        pg.read_mo(bad)


def test_exact_pairs(built):
    for lang in LANGS:
        got = [pair for split in pg.SPLITS for pair in read_pairs(built, split, lang)]
        assert len(got) == len({en for en, _ in got})  # deduplicated on the English message
        assert dict(got) == EXPECTED[lang]


def test_splits_are_disjoint_and_stable(built):
    seen: dict[str, str] = {}
    for split in pg.SPLITS:
        for lang in LANGS:
            for en, _ in read_pairs(built, split, lang):
                assert seen.setdefault(en, split) == split  # one split per English message
    assert {s for s in seen.values()} == set(pg.SPLITS)  # dev and test are not empty
    for en, split in seen.items():  # the documented rule: SHA-256 of "seed:split key"
        x = int(hashlib.sha256(f"1:{pg.split_key(en)}".encode()).hexdigest()[:13], 16) / 16 ** 13
        assert split == ("test" if x < pg.TEST_SHARE else "dev" if x < pg.TEST_SHARE + pg.DEV_SHARE else "train")


def test_split_key_groups_near_duplicates():
    assert pg.split_key("Cannot open %s:") == pg.split_key("cannot open %d") == "cannot open"
    assert pg.split_of("Cannot open %s:", 5) == pg.split_of("cannot  open %d", 5)


def test_multiway_files(built):
    for split in pg.SPLITS:
        multi = {lang: lines(built / f"{split}.multi.{lang}") for lang in ("en", *LANGS)}
        everywhere = [en for en in lines(built / f"{split}.en-es.en") if all(en in EXPECTED[x] for x in LANGS)]
        assert multi["en"] == everywhere
        for lang in LANGS:
            assert multi[lang] == [EXPECTED[lang][en] for en in everywhere]
    test_en = lines(built / "test.multi.en")
    assert test_en and not set(test_en) & set(lines(built / "train.multi.en"))


def test_manifest(built):
    manifest = json.loads((built / "manifest.json").read_text(encoding="utf-8"))
    assert set(manifest["packages"]) == set(pg.PACKAGES)
    read = {(c["lang"], c["domain"]) for c in manifest["catalogs"]}
    assert read == {key for key in CATALOGS if key[1] != "not-listed-domain"}
    for name, digest in manifest["files"].items():
        assert hashlib.sha256((built / name).read_bytes()).hexdigest() == digest
    for lang in LANGS:
        for split in pg.SPLITS:
            assert manifest["counts"][lang][split] == len(lines(built / f"{split}.en-{lang}.en"))
    assert manifest["dropped"]["plural"] == 1 and manifest["dropped"]["empty"] == 1
    assert manifest["dropped"]["path"] == 4 and manifest["dropped"]["no_words"] == 2
    assert manifest["dropped"]["long"] == 1 and manifest["dropped"]["control"] == 1
    assert manifest["conflicts"]["es"] == 2  # Close and Print
    assert manifest["identical"]["de"] == 1  # Grüße


def test_second_run_is_byte_identical(locale_dir, built, tmp_path):
    assert run(locale_dir, tmp_path) == 0
    names = sorted(p.name for p in built.iterdir())
    assert names == sorted(p.name for p in tmp_path.iterdir())
    for name in names:
        assert (built / name).read_bytes() == (tmp_path / name).read_bytes(), name


def test_fewer_languages_remove_stale_files(locale_dir, tmp_path):
    assert run(locale_dir, tmp_path) == 0
    assert pg.main(["--locale-dir", str(locale_dir), "--no-install", "--out", str(tmp_path), "--langs", "es"]) == 0
    assert not list(tmp_path.glob("*.en-de.*")) and not list(tmp_path.glob("*.multi.ja"))
    assert (tmp_path / "test.multi.es").read_bytes() == (tmp_path / "test.en-es.es").read_bytes()


@pytest.mark.slow
def test_command_line_errors(locale_dir, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for args in (["--langs", "en,es"], ["--langs", "es,es"], ["--locale-dir", str(tmp_path / "none")],
                 ["--langs", "xx"]):
        result = subprocess.run([sys.executable, str(SCRIPT), "--no-install", "--out", str(tmp_path / "o"),
                                 "--locale-dir", str(locale_dir), *args], capture_output=True, text=True, env=env)
        assert result.returncode == 2, args
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: "), result.stderr


def test_install_needs_root(monkeypatch, capsys):
    monkeypatch.setattr(pg, "installed_versions", lambda pkgs: {p: None if p == "tar" else "1" for p in pkgs})
    monkeypatch.setattr(pg.os, "geteuid", lambda: 1000)
    problem = pg.install_missing(["bash", "tar"])
    assert "1 of the 2 packages are missing (tar)" in problem and "--no-install" in problem
    assert "\n" not in problem


@pytest.mark.slow
def test_install_runs_apt_get_for_missing_only(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(pg, "installed_versions", lambda pkgs: {p: None if p != "bash" else "5.2" for p in pkgs})
    monkeypatch.setattr(pg.os, "geteuid", lambda: 0)
    monkeypatch.setattr(pg.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(pg.subprocess, "run", lambda cmd, env: calls.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    assert pg.install_missing(["bash", "nano", "tar"]) is None
    assert calls == [["apt-get", "install", "-y", "--no-install-recommends", "nano", "tar"]]
    assert "running: apt-get install -y --no-install-recommends nano tar" in capsys.readouterr().out


@pytest.mark.parametrize("english, translation, expected", [
    ("_Open", "_Abrir", ("Open", "Abrir")),
    ("_Cancel", "C_ancelar", ("Cancel", "Cancelar")),
    ("Save _As", "名前を付けて保存(_A)...", ("Save As", "名前を付けて保存...")),
    ("&Fullscreen", "全画面表示 (&F)", ("Fullscreen", "全画面表示")),
    ("Dept&h:", "&Profundidad:", ("Depth:", "Profundidad:")),
    ("LC_ALL is set", "LC_ALL está definida", ("LC_ALL is set", "LC_ALL está definida")),  # identifier
    ("AT&T modem", "Módem AT&T", ("AT&T modem", "Módem AT&T")),
    ("Tom &amp; Jerry", "Tom &amp; Jerry", ("Tom &amp; Jerry", "Tom &amp; Jerry")),
])
def test_strip_mnemonics(english, translation, expected):
    assert pg.strip_mnemonics(english, translation) == expected


@pytest.mark.parametrize("text, path", [
    ("cannot open /dev/null", True), ("see ~/x", True), ("copy to ./out", True), ("in C:\\x", True),
    ("ftp://host", True), ('file "/a/b"', True), ("and/or", False), ("Read/Write", False), ("%s/%s", False),
    ("1/2 done", False),
])
def test_has_path(text, path):
    assert pg.has_path(text) is path


@pytest.mark.slow
@pytest.mark.skipif(not (SYSTEM_LOCALE / "es" / "LC_MESSAGES").is_dir(),
                    reason="no system catalogs under /usr/share/locale/es (not a Debian-like system with locales)")
def test_system_catalogs_invariants(tmp_path):
    assert pg.main(["--no-install", "--out", str(tmp_path), "--langs", "es,ja"]) == 0
    english = {}
    for split in pg.SPLITS:
        for lang in ("es", "ja"):
            pairs = read_pairs(tmp_path, split, lang)
            assert all(en and xx and "\t" not in en + xx for en, xx in pairs)
            for en, _ in pairs:
                assert english.setdefault(en, split) == split
        multi = [lines(tmp_path / f"{split}.multi.{x}") for x in ("en", "es", "ja")]
        assert len({len(m) for m in multi}) == 1
        assert set(multi[0]) <= {en for en, _ in read_pairs(tmp_path, split, "ja")}
    assert set(english.values()) == set(pg.SPLITS)
