#!/usr/bin/env python3
"""Build a multi-way English-centred corpus from the gettext catalogs Debian ships.

Every package in PACKAGES installs compiled catalogs
``/usr/share/locale/LANG/LC_MESSAGES/DOMAIN.mo``: the same English user-interface
messages translated into many languages. This script installs the packages that
are missing (``apt-get install -y --no-install-recommends``, as root; ``--no-install``
skips it), reads the listed domains for each language, filters and normalises the
messages, resolves conflicting translations, splits the English messages into
train/dev/test with a stable hash and writes

* ``OUT/{train,dev,test}.en-xx.{en,xx}``: English-xx pairs, line-aligned (every message
  of the split that has an xx translation);
* ``OUT/{train,dev,test}.multi.{en,xx,...}``: the messages translated into every
  language of ``--langs``, line-aligned across all the files (zero-shot directions
  such as es->de are evaluated on ``test.multi.es`` / ``test.multi.de``);
* ``OUT/manifest.json``: options, package versions, every catalog read (with its
  SHA-256), the counts and the SHA-256 of every output file.

Usage::

    python scripts/prepare_gettext.py [--out data/gettext] [--langs es,de,...] [--no-install]

Filtering, normalisation, conflict and split rules: data/gettext/README.md and the
docstrings below. The output is a pure function of the catalogs and the options:
a second run writes byte-identical files.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import unicodedata
from dataclasses import dataclass
from pathlib import Path

# Debian 12 "bookworm" packages and the gettext domains of theirs that are read.
# Left out on purpose: catalogs of proper nouns (iso_3166-2 subdivisions, iso_639-3
# language names, gnome-control-center's time-zone cities), the legacy iso-codes
# names that are symlinks to the current ones, and packages that run a service or
# need an init system when installed (postgresql-15, packagekit, systemd, polkitd).
PACKAGES: dict[str, tuple[str, ...]] = {
    "adduser": ("adduser",),
    "appstream": ("appstream",),
    "apt": ("apt",),
    "aptitude-common": ("aptitude",),
    "at-spi2-common": ("at-spi2-core",),
    "audacity-data": ("audacity",),
    "bash": ("bash",),
    "binutils-common": ("bfd", "binutils", "gas", "gold", "gprof", "ld", "opcodes"),
    "bison": ("bison", "bison-gnulib", "bison-runtime"),
    "coreutils": ("coreutils",),
    "cpio": ("cpio",),
    "dialog": ("dialog",),
    "diffutils": ("diffutils",),
    "dpkg": ("dpkg",),
    "evince-common": ("evince",),
    "evolution-data-server-common": ("evolution-data-server",),
    "filezilla-common": ("filezilla",),
    "findutils": ("findutils",),
    "gawk": ("gawk",),
    "geany-common": ("geany",),
    "gedit-common": ("gedit",),
    "gettext": ("gettext-tools",),
    "gettext-base": ("gettext-runtime",),
    "gimp-data": ("gimp20", "gimp20-python", "gimp20-script-fu", "gimp20-std-plug-ins"),
    "git": ("git",),
    "glib-networking-common": ("glib-networking",),
    "gnome-control-center-data": ("gnome-control-center-2.0",),
    "gnome-desktop3-data": ("gnome-desktop-3.0",),
    "gnome-menus": ("gnome-menus",),
    "gnome-shell-common": ("gnome-shell",),
    "gnome-software-common": ("gnome-software",),
    "gnucash-common": ("gnucash",),
    "gnumeric-common": ("gnumeric-1.12.55",),
    "gnupg-l10n": ("gnupg2",),
    "gparted-common": ("gparted",),
    "grep": ("grep",),
    "gsettings-desktop-schemas": ("gsettings-desktop-schemas",),
    "gvfs-common": ("gvfs",),
    "hexchat-common": ("hexchat",),
    "iso-codes": ("iso_15924", "iso_3166-1", "iso_3166-3", "iso_4217", "iso_639-2", "iso_639-5"),
    "kbd": ("kbd",),
    "krb5-locales": ("mit-krb5",),
    "libapt-pkg6.0": ("libapt-pkg6.0",),
    "libavahi-common-data": ("avahi",),
    "libc-l10n": ("libc",),
    "libdpkg-perl": ("dpkg-dev",),
    "libelf1": ("elfutils",),
    "libexif12": ("libexif-12",),
    "libgdata-common": ("gdata",),
    "libgdk-pixbuf2.0-common": ("gdk-pixbuf",),
    "libglib2.0-data": ("glib20",),
    "libgnomekbd-common": ("libgnomekbd",),
    "libgnutls30": ("gnutls30",),
    "libgpg-error-l10n": ("libgpg-error",),
    "libgphoto2-l10n": ("libgphoto2-6",),
    "libgsf-1-common": ("libgsf",),
    "libgstreamer1.0-0": ("gstreamer-1.0",),
    "libgtk-3-common": ("gtk30", "gtk30-properties"),
    "libgtk-4-common": ("gtk40",),
    "libgtk2.0-common": ("gtk20", "gtk20-properties"),
    "libgtksourceview-4-common": ("gtksourceview-4",),
    "libgtop2-common": ("libgtop",),
    "libidn2-0": ("libidn2",),
    "libjson-glib-1.0-common": ("json-glib-1.0",),
    "libpam-runtime": ("Linux-PAM",),
    "libparted-i18n": ("parted",),
    "libpeas-common": ("libpeas-1.0",),
    "libpopt0": ("popt",),
    "libpq5": ("libpq5-15",),
    "libsecret-common": ("libsecret",),
    "libsoup-3.0-common": ("libsoup-3.0",),
    "libsoup2.4-common": ("libsoup",),
    "libvte-2.91-common": ("vte-2.91",),
    "libwnck-3-common": ("libwnck-3.0",),
    "libxfce4ui-common": ("libxfce4ui",),
    "libxfce4util-common": ("libxfce4util",),
    "login": ("shadow",),
    "lynx-common": ("lynx",),
    "m4": ("m4",),
    "make": ("make",),
    "man-db": ("man-db", "man-db-gnulib"),
    "mc-data": ("mc",),
    "mutter-common": ("mutter",),
    "nano": ("nano",),
    "nautilus-data": ("nautilus",),
    "net-tools": ("net-tools",),
    "pidgin-data": ("pidgin",),
    "postgresql-client-15": ("pg_amcheck-15", "pg_basebackup-15", "pg_config-15", "pg_dump-15",
                             "pg_verifybackup-15", "pgscripts-15", "psql-15"),
    "procps": ("procps-ng",),
    "psmisc": ("psmisc",),
    "python-apt-common": ("python-apt",),
    "rhythmbox-data": ("rhythmbox",),
    "sed": ("sed",),
    "shared-mime-info": ("shared-mime-info",),
    "sharutils": ("sharutils",),
    "sudo": ("sudo", "sudoers"),
    "tar": ("tar",),
    "thunar-data": ("thunar",),
    "totem-common": ("totem",),
    "util-linux-locales": ("util-linux",),
    "vlc-l10n": ("vlc",),
    "wdiff": ("wdiff", "wdiff-gnulib"),
    "wget": ("wget", "wget-gnulib"),
    "xdg-user-dirs": ("xdg-user-dirs",),
    "xfsprogs": ("xfsprogs",),
    "xkb-data": ("xkeyboard-config",),
    "xz-utils": ("xz",),
    "zenity-common": ("zenity",),
}

DEFAULT_LANGS = ("es", "de", "fr", "pt_BR", "it", "ru", "ja", "zh_CN")
MAX_EN_CHARS = 200  # longer English messages (mostly --help blocks, ~1%) are left out
MAX_TR_CHARS = 300  # longer translations are left out
DEV_SHARE = TEST_SHARE = 0.02  # of the split keys (see split_of)
SPLITS = ("train", "dev", "test")
SOURCE = "en"


# ---------------------------------------------------------------------------
# Reading .mo files
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MoEntry:
    msgid: str  # without context; "" for the header
    msgstr: str  # for plural entries, the first form
    context: str | None = None
    plural: bool = False


_MO_MAGIC = 0x950412DE
_CHARSET = re.compile(r"charset=\s*([A-Za-z0-9_.:-]+)", re.I)


def read_mo(path: Path) -> list[MoEntry]:
    """All entries of a compiled catalog, in file order, decoded with the header's charset.

    The .mo format (GNU gettext manual, "The Format of GNU MO Files"): a magic number
    giving the byte order, a revision, the number N of strings and the offsets of two
    tables of N (length, offset) records for the original and translated strings. A
    context is stored as ``ctxt\\x04msgid``, a plural as ``msgid\\x00msgid_plural`` with
    the translated forms separated by ``\\x00``. Raises ValueError for a malformed file.
    """
    data = Path(path).read_bytes()
    if len(data) < 20:
        raise ValueError(f"{path}: too short for a .mo file")
    for order in "<>":
        if struct.unpack(order + "I", data[:4])[0] == _MO_MAGIC:
            break
    else:
        raise ValueError(f"{path}: not a .mo file (bad magic number)")
    _, n, orig_at, trans_at = struct.unpack(order + "4I", data[4:20])
    raw: list[tuple[bytes, bytes]] = []
    for i in range(n):
        pair = []
        for table in (orig_at, trans_at):
            length, offset = struct.unpack(order + "2I", data[table + 8 * i: table + 8 * i + 8])
            if offset + length > len(data):
                raise ValueError(f"{path}: string {i} lies outside the file")
            pair.append(data[offset: offset + length])
        raw.append((pair[0], pair[1]))
    header = next((t for o, t in raw if o == b""), b"").decode("ascii", "replace")
    match = _CHARSET.search(header)
    charset = match.group(1) if match and match.group(1).upper() != "CHARSET" else "utf-8"
    entries = []
    for orig, trans in raw:
        msgid, msgstr = orig.decode(charset, "replace"), trans.decode(charset, "replace")
        context = None
        if "\x04" in msgid:
            context, msgid = msgid.split("\x04", 1)
        plural = "\x00" in msgid
        entries.append(MoEntry(msgid.split("\x00")[0], msgstr.split("\x00")[0], context, plural))
    return entries


# ---------------------------------------------------------------------------
# Normalisation and filters
# ---------------------------------------------------------------------------

def one_line(text: str) -> str:
    """Whitespace runs (newlines, tabs, Unicode spaces and line separators) -> one space; stripped."""
    return " ".join(text.split())


_MNEMONIC_SUFFIX = re.compile(r"\s?[(（][_&][0-9A-Za-z][)）]")
_MARKER = re.compile(r"[_&](?=[^\W_])(?!(?<=&)#?\w+;)")  # "_" or "&" before a letter or digit, not an entity


def _is_english_mnemonic(text: str, i: int) -> bool:
    """Whether the marker at text[i] is a mnemonic: "_" starting a word ("_Open", "Re-_center";
    "LC_ALL" is an identifier), or "&" not between two capitals ("&Open", "Dept&h"; not "AT&T")."""
    before, after = text[i - 1] if i else " ", text[i + 1]
    if text[i] == "_":
        return not (before.isalnum() or before == "_")
    return before != "&" and not (before.isupper() and after.isupper())


def strip_mnemonics(english: str, translation: str) -> tuple[str, str]:
    """Remove a keyboard mnemonic marker from both sides when the English message has one.

    GTK marks the access key with "_" ("_Open"; "Ay_uda" in Spanish), wxWidgets and Qt with
    "&" ("&Open", "Dept&h"); Japanese and Chinese catalogs append it ("開く(_O)"). The English
    message has a mnemonic when its only marker ("_" or "&" before a letter or digit) is one
    (see _is_english_mnemonic). The translation then loses its "(_X)" / "(&X)" suffixes, or
    else its marker when it holds exactly one. Without an English mnemonic nothing changes.
    """
    markers = list(_MARKER.finditer(english))
    if len(markers) != 1 or not _is_english_mnemonic(english, markers[0].start()):
        return english, translation
    i = markers[0].start()
    english = english[:i] + english[i + 1:]
    stripped = _MNEMONIC_SUFFIX.sub("", translation)
    if stripped == translation:
        found = list(_MARKER.finditer(translation))
        if len(found) == 1:
            j = found[0].start()
            stripped = translation[:j] + translation[j + 1:]
    return english, stripped


# A file-system path or a URL: an absolute path with two components or under a
# system directory, ~/..., ./... or ../..., a Windows drive or UNC path, scheme://.
_PATH = re.compile(
    r"(?:^|(?<=[\s\"'`(\[<=:,]))"
    r"(?:~/|\.\.?/\w|/[\w.@%$-]+/[\w.@%${}*-]+"
    r"|/(?:usr|etc|var|dev|tmp|proc|home|opt|bin|sbin|lib\w*|sys|run|boot|srv|mnt|media|root)\b)"
    r"|\b[A-Za-z]:\\|\\\\\w|\b\w+://"
)
# printf conversions (with flags, positions, widths, C99 length macros), brace and
# shell placeholders.
_FORMAT = re.compile(
    r"%(?:\d+\$)?[-+ #0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|ll|[hlLqjzt]|I64)?[diouxXeEfFgGaAcspnC%]"
    r"|%<\w+>|\{[\w.:!-]*\}|\$\{?\w+\}?"
)


def has_path(text: str) -> bool:
    return _PATH.search(text) is not None


def has_words(text: str) -> bool:
    """True when a letter is left after removing format codes (not only codes, digits or punctuation)."""
    return any(ch.isalpha() for ch in _FORMAT.sub(" ", text))


def has_control(text: str) -> bool:
    return any(unicodedata.category(ch) == "Cc" for ch in text)


def drop_reason(english: str, translation: str) -> str | None:
    """Why a normalised (English, translation) pair is left out, or None to keep it."""
    if not translation:
        return "empty"
    if has_path(english) or has_path(translation):
        return "path"
    if not has_words(english):
        return "no_words"
    if len(english) > MAX_EN_CHARS or len(translation) > MAX_TR_CHARS:
        return "long"
    if has_control(english) or has_control(translation):
        return "control"
    return None


# ---------------------------------------------------------------------------
# Collecting, resolving, splitting
# ---------------------------------------------------------------------------


def catalog_path(locale_dir: Path, lang: str, domain: str) -> Path:
    return Path(locale_dir) / lang / "LC_MESSAGES" / f"{domain}.mo"


def collect(locale_dir: Path, langs: list[str], packages: dict[str, tuple[str, ...]]):
    """Read every listed catalog; return (votes, catalogs, dropped).

    votes[lang][english] is a Counter of the translations given for that English
    message (one vote per catalog entry, contexts ignored); catalogs describes every
    file read; dropped counts the entries left out per rule.
    """
    votes: dict[str, dict[str, collections.Counter]] = {lang: collections.defaultdict(collections.Counter)
                                                         for lang in langs}
    catalogs, dropped = [], collections.Counter()
    for lang in langs:
        for package in sorted(packages):
            for domain in packages[package]:
                path = catalog_path(locale_dir, lang, domain)
                if not path.is_file():
                    continue
                kept = 0
                for entry in read_mo(path):
                    if entry.msgid == "":
                        dropped["header"] += 1
                        continue
                    if entry.plural:
                        dropped["plural"] += 1
                        continue
                    english, translation = strip_mnemonics(one_line(entry.msgid), one_line(entry.msgstr))
                    reason = drop_reason(english, translation)
                    if reason:
                        dropped[reason] += 1
                        continue
                    votes[lang][english][translation] += 1
                    kept += 1
                catalogs.append({"lang": lang, "package": package, "domain": domain, "kept": kept,
                                 "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    return votes, catalogs, dropped


def choose(counter: collections.Counter) -> str:
    """The translation given most often; ties go to the smallest string (code-point order)."""
    return min(counter.items(), key=lambda item: (-item[1], item[0]))[0]


def split_key(english: str) -> str:
    """What the split hashes: the lower-cased words of the message without format codes,
    so that near-duplicates ("Cannot open %s", "cannot open %s:") share a split."""
    return " ".join(re.findall(r"[^\W_]+", _FORMAT.sub(" ", english).lower()))


def split_of(english: str, seed: int) -> str:
    """A stable split for an English message: SHA-256 of "seed:split_key" -> [0, 1)."""
    digest = hashlib.sha256(f"{seed}:{split_key(english)}".encode("utf-8")).hexdigest()
    x = int(digest[:13], 16) / 16 ** 13
    return "test" if x < TEST_SHARE else "dev" if x < TEST_SHARE + DEV_SHARE else "train"


def order_key(english: str, seed: int) -> str:
    """Line order inside a split: by a hash of the message (catalogs interleaved), then the message."""
    return hashlib.sha256(f"order:{seed}:{english}".encode("utf-8")).hexdigest() + english


def build(votes: dict[str, dict[str, collections.Counter]], seed: int):
    """Resolve conflicts and split: returns (chosen, splits).

    chosen[lang][english] = translation; splits[split] = the English messages of that
    split (every message with at least one translation), in output order.
    """
    chosen = {lang: {en: choose(c) for en, c in by_en.items()} for lang, by_en in votes.items()}
    messages = set().union(*(set(c) for c in chosen.values())) if chosen else set()
    splits: dict[str, list[str]] = {name: [] for name in SPLITS}
    for english in messages:
        splits[split_of(english, seed)].append(english)
    for name in SPLITS:
        splits[name].sort(key=lambda en: order_key(en, seed))
    return chosen, splits


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


def write_lines(path: Path, lines: list[str]) -> str:
    """Write UTF-8 lines ("\\n" endings); return the file's SHA-256."""
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


_CORPUS_FILE = re.compile(r"(?:train|dev|test)\.(?:en-[\w.-]+|multi\.[\w-]+)")


def remove_stale(out: Path, written: dict[str, str]) -> list[str]:
    """Delete corpus files of an earlier run (other --langs) that this run did not write."""
    stale = sorted(p.name for p in out.iterdir()
                   if p.is_file() and _CORPUS_FILE.fullmatch(p.name) and p.name not in written)
    for name in stale:
        (out / name).unlink()
    return stale


def write_corpus(out: Path, langs: list[str], chosen: dict, splits: dict) -> tuple[dict, dict, dict]:
    """Write the pair and multi-way files; return (counts, multi_counts, file hashes)."""
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, dict[str, int]] = {lang: {} for lang in langs}
    multi: dict[str, int] = {}
    files: dict[str, str] = {}
    for name in SPLITS:
        for lang in langs:
            messages = [en for en in splits[name] if en in chosen[lang]]
            counts[lang][name] = len(messages)
            stem = f"{name}.{SOURCE}-{lang}"
            files[f"{stem}.{SOURCE}"] = write_lines(out / f"{stem}.{SOURCE}", messages)
            files[f"{stem}.{lang}"] = write_lines(out / f"{stem}.{lang}", [chosen[lang][en] for en in messages])
        everywhere = [en for en in splits[name] if all(en in chosen[lang] for lang in langs)]
        multi[name] = len(everywhere)
        files[f"{name}.multi.{SOURCE}"] = write_lines(out / f"{name}.multi.{SOURCE}", everywhere)
        for lang in langs:
            files[f"{name}.multi.{lang}"] = write_lines(out / f"{name}.multi.{lang}",
                                                        [chosen[lang][en] for en in everywhere])
    return counts, multi, files


def format_table(langs: list[str], counts: dict, multi: dict, same: dict) -> str:
    """The per-language table printed at the end (pairs per split; "same" = translation == English)."""
    rows = [f"{'pair':12} {'train':>8} {'dev':>6} {'test':>6} {'same':>6}"]
    for lang in langs:
        c = counts[lang]
        rows.append(f"{SOURCE + '-' + lang:12} {c['train']:8d} {c['dev']:6d} {c['test']:6d} {same[lang]:6d}")
    rows.append(f"{'multi-way':12} {multi['train']:8d} {multi['dev']:6d} {multi['test']:6d}")
    return "\n".join(rows)


# ---------------------------------------------------------------------------
# Debian packages
# ---------------------------------------------------------------------------


def installed_versions(packages: list[str]) -> dict[str, str | None]:
    """{package: installed version or None} from dpkg-query (all None without dpkg)."""
    versions: dict[str, str | None] = {p: None for p in packages}
    if shutil.which("dpkg-query") is None:
        return versions
    result = subprocess.run(["dpkg-query", "-W", "-f=${Package}\t${Version}\t${db:Status-Abbrev}\n", *packages],
                            capture_output=True, text=True)
    for line in result.stdout.splitlines():
        name, version, status = (line.split("\t") + ["", ""])[:3]
        name = name.split(":")[0]
        if name in versions and status.startswith("ii") and version:
            versions[name] = version
    return versions


def install_missing(packages: list[str]) -> str | None:
    """apt-get install the packages that are not installed; return an error line or None."""
    missing = [p for p, v in installed_versions(packages).items() if v is None]
    if not missing:
        print(f"packages: all {len(packages)} installed")
        return None
    if shutil.which("apt-get") is None or shutil.which("dpkg-query") is None or os.geteuid() != 0:
        return (f"{len(missing)} of the {len(packages)} packages are missing ({', '.join(missing[:5])}"
                f"{', ...' if len(missing) > 5 else ''}); installing them needs root and apt-get: "
                "run as root, or pass --no-install to use the catalogs already installed")
    command = ["apt-get", "install", "-y", "--no-install-recommends", *missing]
    print("running: " + " ".join(command), flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    if subprocess.run(command, env=env).returncode != 0:
        return "apt-get install failed (see above); try apt-get update first, or pass --no-install"
    return None


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("data/gettext"), help="output directory (default: data/gettext)")
    parser.add_argument("--langs", default=",".join(DEFAULT_LANGS),
                        help="target languages, as named under the locale folder (default: %(default)s)")
    parser.add_argument("--locale-dir", type=Path, default=Path("/usr/share/locale"),
                        help="folder holding LANG/LC_MESSAGES/*.mo (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="salt of the split and order hashes (default: 1)")
    parser.add_argument("--no-install", action="store_true", help="do not apt-get install missing packages")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    langs = [lang for lang in args.langs.split(",") if lang]
    if not langs or len(set(langs)) != len(langs) or SOURCE in langs:
        print(f"error: --langs needs distinct languages other than {SOURCE}: {args.langs!r}", file=sys.stderr)
        return 2
    if not args.locale_dir.is_dir():
        print(f"error: no locale folder {args.locale_dir}", file=sys.stderr)
        return 2
    if not args.no_install:
        problem = install_missing(sorted(PACKAGES))
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
    try:
        votes, catalogs, dropped = collect(args.locale_dir, langs, PACKAGES)
    except (OSError, ValueError, LookupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    chosen, splits = build(votes, args.seed)
    if not any(chosen.values()):
        print(f"error: no catalog of the listed packages for {','.join(langs)} under {args.locale_dir}", file=sys.stderr)
        return 2
    counts, multi, files = write_corpus(args.out, langs, chosen, splits)
    stale = remove_stale(args.out, files)
    if stale:
        print(f"removed {len(stale)} corpus files of an earlier run: {', '.join(stale[:4])}{' ...' if len(stale) > 4 else ''}")
    same = {lang: sum(en == tr for en, tr in chosen[lang].items()) for lang in langs}
    conflicts = {lang: sum(len(c) > 1 for c in votes[lang].values()) for lang in langs}
    manifest = {
        "options": {"langs": langs, "seed": args.seed, "locale_dir": str(args.locale_dir),
                    "max_en_chars": MAX_EN_CHARS, "max_tr_chars": MAX_TR_CHARS,
                    "dev_share": DEV_SHARE, "test_share": TEST_SHARE},
        "packages": installed_versions(sorted(PACKAGES)),
        "catalogs": catalogs,
        "dropped": dict(sorted(dropped.items())),
        "conflicts": conflicts,
        "identical": same,
        "counts": counts,
        "multi": multi,
        "files": files,
    }
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                                            encoding="utf-8")
    print(f"catalogs read: {len(catalogs)}; entries left out: "
          + ", ".join(f"{k} {v}" for k, v in sorted(dropped.items())))
    print(f"English messages: {sum(len(s) for s in splits.values())}; conflicting translations resolved: "
          + ", ".join(f"{lang} {conflicts[lang]}" for lang in langs))
    print(format_table(langs, counts, multi, same))
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
