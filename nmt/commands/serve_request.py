"""A POST /translate request of `nmt serve` (nmt/commands/serve.py): its body parsed and checked, its decode
options validated against the server's defaults and limits, and the JSON of its answer."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from nmt import textio
from nmt.commands.batcher import Settings
from nmt.config import ConfigError, DecodeConfig, decode_options, decode_value
from nmt.errors import UserError

# Decode keys fixed for the whole server (`nmt serve` flags), with why a request may not set them.
SERVER_KEYS = {
    "batch_tokens": "the server's batching", "max_batch_size": "the server's batching",
    "workers": "the server's threads",
    "protect_pattern": "a regular expression run on every line (a slow one would stall every request)",
}
REQUEST_KEYS = tuple(name for name, _, _ in decode_options() if name not in SERVER_KEYS)
FIELDS = ("text", "options", "prefix", "glossary", "glossary_ignore_case", "stream")  # of a POST /translate body


_FLAG = re.compile(r"(?<![\w-])(?<!serve )--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")  # `--tgt-lang`, not `nmt serve --x`


def request_message(error: Exception) -> str:
    """The one-line message of a library error as a request's answer says it: the command-line flag of a
    request key (`--tgt-lang`, `--contrast-lang`) becomes that key (`tgt_lang`); other flags stay."""
    def key(m: re.Match) -> str:
        name = m.group(1).replace("-", "_")
        return name if name in REQUEST_KEYS else m.group(0)

    return _FLAG.sub(key, str(error))


class RequestError(Exception):
    """A request the server refuses: HTTP status, a one-line message, headers of the answer."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers


@dataclass(frozen=True)
class Request:
    """A POST /translate body, parsed and checked (`parse_request`); its options not yet validated."""

    lines: list[str]
    prefixes: list[str] | None
    options: dict  # decode keys by their flag names
    glossary: Any  # a nmt.text.glossary.Glossary, or None
    stream: bool = False  # answer in JSON lines, each line as soon as it is translated (docs/serving.md)


def parse_request(body: bytes, settings: Settings) -> Request:
    """The Request of a POST /translate body, or RequestError."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not JSON: {e}") from None
    except RecursionError:
        raise RequestError(400, "the body is not a translation request: JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise RequestError(400, 'the body must be a JSON object: {"text": ["a sentence", ...], "options": {...}}')
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise RequestError(400, f"unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
    lines = _string_list(data.get("text"), "text")
    prefixes = _string_list(data["prefix"], "prefix") if data.get("prefix") is not None else None
    if prefixes is not None and len(prefixes) != len(lines):
        raise RequestError(400, f"{len(prefixes)} prefixes for {len(lines)} lines")
    options = data.get("options") or {}
    if not isinstance(options, dict):
        raise RequestError(400, "options must be a JSON object of decode keys, e.g. {\"beam_size\": 4}")
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise RequestError(400, "stream must be true or false")
    _check_size(lines, prefixes, settings)
    return Request(lines, prefixes, options, parse_glossary(data), stream)


def parse_glossary(data: dict):
    """The request's glossary (`"glossary": [["source", "target"], ...]`, `"glossary_ignore_case"`) as a
    compiled nmt.text.glossary.Glossary, or None: RequestError 400 for a malformed one, 413 beyond
    nmt.text.glossary.MAX_ENTRIES entries. `data`: the parsed body."""
    from nmt.text.glossary import MAX_ENTRIES, Glossary, GlossaryTooLarge, check_entries

    ignore_case = data.get("glossary_ignore_case", False)
    if not isinstance(ignore_case, bool):
        raise RequestError(400, "glossary_ignore_case must be true or false")
    if data.get("glossary") is None:
        if ignore_case:
            raise RequestError(400, "glossary_ignore_case needs a glossary")
        return None
    try:
        return Glossary(check_entries(data["glossary"], MAX_ENTRIES), ignore_case)
    except GlossaryTooLarge as e:
        raise RequestError(413, f"{e} in one request") from None
    except UserError as e:
        raise RequestError(400, request_message(e)) from None


def _string_list(value: Any, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise RequestError(400, f"{name} must be a list of strings, one sentence each")
    for i, line in enumerate(value):
        if "\n" in line or "\r" in line:
            raise RequestError(400, f"{name}[{i}] contains a line break (one sentence per item)")
        bad = textio.lone_surrogate(line)
        if bad:  # no UTF-8 text has one (nmt translate refuses such input as invalid UTF-8)
            raise RequestError(400, f"{name}[{i}] is not Unicode text: {bad}")
    return value


def _check_size(lines: list[str], prefixes: list[str] | None, settings: Settings) -> None:
    if len(lines) > settings.max_lines:
        raise RequestError(413, f"{len(lines)} lines in one request (this server takes at most "
                                f"{settings.max_lines}: nmt serve --max-lines)")
    chars = sum(map(len, lines)) + sum(map(len, prefixes or ()))
    if chars > settings.max_chars:
        raise RequestError(413, f"{chars} characters in one request (this server takes at most "
                                f"{settings.max_chars}: nmt serve --max-chars)")


def check_options(translator, options: dict, settings: Settings) -> DecodeConfig:
    """The request's decode settings (the server's defaults with `options` applied), or RequestError
    400 with the messages `nmt translate` gives for the same flags, or naming the server's limit.
    The one validation of a request's options: the batcher groups requests by these settings and
    passes them to the translator as they are (`Translator.translate(settings=...)`)."""
    for key in options:
        if key in SERVER_KEYS:
            raise RequestError(400, f"option {key!r} is not set per request ({SERVER_KEYS[key]}: "
                                    f"nmt serve --{key.replace('_', '-')} sets it for the server)")
    try:
        decode = translator.decode_settings(**options)
        translator.check_language(decode)  # a multilingual model needs tgt_lang unless it has a default
    except ConfigError as e:
        raise RequestError(400, "; ".join(e.errors)) from None
    except UserError as e:
        raise RequestError(400, request_message(e)) from None
    errors = over_limits(decode, options, settings.max_beam, translator.max_positions)
    if errors:
        raise RequestError(400, errors[0])
    return decode


LENGTH_KEYS = ("min_len", "max_len_a", "max_len_b")


def over_limits(decode: DecodeConfig, lengths_given, max_beam: int, max_positions: int) -> list[str]:
    """What in `decode` is over the server's limits, one message each: beam_size, nbest and
    glossary_beam_size over --max-beam; min_len, max_len_a, max_len_b (those in `lengths_given`: the model's own defaults
    may exceed them, and are capped as in `nmt translate`) past what the model can write, an output
    of at most max_positions - 1 tokens, EOS included (a request asking more would search to the
    model's limit and return less than it asked for)."""
    errors = [f"{key} {decode_value(decode, key)} is over this server's limit {max_beam} (nmt serve --max-beam)"
              for key in ("beam_size", "nbest", "glossary_beam_size") if (decode_value(decode, key) or 0) > max_beam]
    longest = max_positions - 1
    for key, limit in zip(LENGTH_KEYS, (longest - 1, longest, longest)):
        if key in lengths_given and getattr(decode, key) > limit:
            errors.append(f"{key} {getattr(decode, key):g} is over this model's limit {limit} (its outputs have at "
                          f"most max_positions - 1 = {longest} tokens, EOS included)")
    return errors


# --------------------------------------------------------------------------- answers

def _number(x: float) -> float | None:
    return x if math.isfinite(x) else None  # JSON has no inf / nan


def _hypothesis(h, decode: DecodeConfig) -> dict:
    out = {"text": h.text, "score": _number(h.score), "log_prob": _number(h.log_prob), "finished": h.finished}
    if decode.alignment:
        out["alignment"] = h.format_alignment()
    return out


def result_json(result, decode: DecodeConfig, prefixed: bool = False) -> dict:
    """One item of the response's "translations" for a TranslationResult (prefixed: the request
    gave prefixes, so the item says whether its prefix was cut to the model's maximum)."""
    out = _hypothesis(result.hypotheses[0], decode)
    out["truncated"] = result.truncated
    if prefixed:
        out["prefix_truncated"] = result.prefix_truncated
    if decode.protect:
        out["protected"] = result.protected
    if decode.nbest > 1:
        out["nbest"] = [_hypothesis(h, decode) for h in result.hypotheses]
    return out
