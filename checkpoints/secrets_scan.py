"""Credential-like values in a payload or a receipt (issue 20, item 7;
docs/security/secrets.md): the field paths (RFC 6901 JSON pointers) and the detector's
type, never the value.

The detectors are Yelp's ``detect-secrets`` plugins, used directly on each string value
of the parsed JSON (``plugin.analyze_string``: the plugins' compiled regexes and their
own validation, such as the JWT plugin's decoding of its parts). Its file-scanning
machinery is not used: ``analyze_line`` reads the process-wide settings and may try to
verify a secret over the network; ``analyze_string`` of the plugins below reads only
class-level compiled patterns and is safe from any thread.

What is looked for (``DETECTORS``): cloud and SaaS API keys (AWS, GitHub, GitLab, Slack,
Stripe, OpenAI, SendGrid, Twilio, Mailchimp, npm, PyPI, Square, Discord, Telegram, Azure
storage, Artifactory, IBM, SoftLayer, Cloudant), JSON Web Tokens, private keys (PEM and
PuTTY blocks), passwords in URLs (``https://user:pw@host``), and keyword assignments
inside a string (``password="..."``, ``"api_key": "..."`` in an embedded JSON text,
``secret=...`` in a query string). Two checks the plugins do not make are ours, and
small: an opaque bearer token (``Bearer <b64token>``, RFC 6750 2.1) and a field *named*
like a credential (the keyword plugin's denylist, plus the authorization and token
header names) holding a non-empty string that is not a placeholder (detect-secrets'
own heuristic filters: ``${X}``, ``<x>``, ``{x}``, ``$X``, no letter or digit).

Left out on purpose: the high-entropy plugins (every id, digest and fingerprint in a
payload is high-entropy text: they flag the demo payloads) and the public IP plugin (an
address is not a credential).

Cost (``SCAN_CHARS``, ``MIN_CHARS``, ``MAX_FINDINGS``): strings shorter than
``MIN_CHARS`` are skipped unless their key names a credential (no detector matches so
short a value); of a longer string only its first ``SCAN_CHARS`` characters are scanned,
so one 1 MiB transcript string costs the same as a 64 KiB one; a payload of many strings
is scanned whole (docs/security/secrets.md gives the measured ms per MiB). A string is
first tested against one combined pattern of the plugins' literal anchors
(``_PREFILTER``); only a string that could match runs the plugins.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import re2
from detect_secrets.filters.heuristic import (
    is_not_alphanumeric_string,
    is_prefixed_with_dollar_sign,
    is_templated_secret,
)
from detect_secrets.plugins import keyword as _keyword
from detect_secrets.plugins.artifactory import ArtifactoryDetector
from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.azure_storage_key import AzureStorageKeyDetector
from detect_secrets.plugins.base import RegexBasedDetector
from detect_secrets.plugins.basic_auth import BasicAuthDetector
from detect_secrets.plugins.cloudant import CloudantDetector
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.ibm_cloud_iam import IbmCloudIamDetector
from detect_secrets.plugins.ibm_cos_hmac import IbmCosHmacDetector
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.npm import NpmDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.softlayer import SoftlayerDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

#: Of a longer string only this many leading characters are scanned.
SCAN_CHARS = 64 * 1024
#: Shorter strings are not scanned for values (a key naming a credential still counts).
MIN_CHARS = 8
#: The keyword plugin's patterns are tried at most at this many denylist words a string.
KEYWORD_TRIES = 64
#: A plugin runs on this many characters either side of each place its patterns match,
#: at most at this many places a string.
WINDOW_MARGIN = 256
WINDOW_TRIES = 16
#: At most this many findings are kept per document (the first ones, in walk order).
MAX_FINDINGS = 50


class BearerTokenDetector(RegexBasedDetector):
    """An opaque OAuth bearer token after its scheme word (RFC 6750 2.1: ``Bearer``,
    one space, a b64token), at least 16 characters: no detect-secrets plugin has it (its
    JWT plugin finds the JWT ones)."""

    secret_type = "Bearer Token"
    denylist = (re.compile(r"\b[Bb]earer +([A-Za-z0-9\-._~+/]{16,}=*)"),)


class KeywordAssignmentDetector(RegexBasedDetector):
    """detect-secrets' keyword plugin on a string value: a credential keyword assigned
    inside the text, quoted (``"password": "x"`` in an embedded JSON text,
    ``api_key = 'x'``) or after ``=`` (``password=x`` in a query string or a ``.env``
    line). Its patterns and groups: the quoted set the plugin uses by default and its
    ``=`` pattern, less the comparison written value-first (``"x" == password``: code,
    not data). Each starts with a denylist word, so each is tried only where RE2 finds
    one (``_DENYLIST_WORDS``, at most ``KEYWORD_TRIES`` places per string): the
    plugin's own ``search`` tries its case-blind alternation at every character (35 us a
    line of 260 characters, measured), which made a 1 MiB transcript of prose cost a
    second. Placeholders (``${X}``, ``<x>``) are dropped as its filters would."""

    secret_type = "Secret Keyword"
    denylist = ()
    _groups = {
        **{regex: group
           for regex, group in _keyword.QUOTES_REQUIRED_DENYLIST_REGEX_TO_GROUP.items()
           if regex is not _keyword.PRECEDED_BY_EQUAL_COMPARISON_SIGNS_QUOTES_REQUIRED_REGEX},
        _keyword.FOLLOWED_BY_EQUAL_SIGNS_REGEX: 5,
    }

    def analyze_string(self, string: str):
        """The values the keyword plugin's patterns find in ``string``, placeholders
        dropped."""
        for n, word in enumerate(_DENYLIST_WORDS.finditer(string)):
            if n >= KEYWORD_TRIES:
                return
            for regex, group in self._groups.items():
                match = regex.match(string, word.start())
                if match is not None and not _placeholder(match.group(group)):
                    yield match.group(group)


def _re2(pattern: str):
    """``pattern`` compiled by RE2 (linear time), quietly: a refusal raises."""
    options = re2.Options()
    options.max_mem = 16 << 20
    options.log_errors = False
    return re2.compile(pattern, options)


#: The keyword plugin's denylist words, case-blind (where its patterns can start).
_DENYLIST_WORDS = _re2(r"(?i:{})".format("|".join(_keyword.DENYLIST)))


@dataclass(frozen=True)
class Detector:
    """One kind of credential: its stable ``type`` word (stored and answered), the
    ``label`` people read ("bearer token"), and the detect-secrets plugin that finds it."""

    type: str
    label: str
    plugin: Any


KEYWORD = Detector("keyword_secret", "credential keyword", KeywordAssignmentDetector())
DETECTORS: tuple[Detector, ...] = (
    Detector("private_key", "private key", PrivateKeyDetector()),
    Detector("aws_access_key", "AWS access key", AWSKeyDetector()),
    Detector("github_token", "GitHub token", GitHubTokenDetector()),
    Detector("gitlab_token", "GitLab token", GitLabTokenDetector()),
    Detector("slack_token", "Slack token", SlackDetector()),
    Detector("stripe_key", "Stripe key", StripeDetector()),
    Detector("openai_key", "OpenAI key", OpenAIDetector()),
    Detector("sendgrid_key", "SendGrid key", SendGridDetector()),
    Detector("twilio_key", "Twilio key", TwilioKeyDetector()),
    Detector("mailchimp_key", "Mailchimp key", MailchimpDetector()),
    Detector("npm_token", "npm token", NpmDetector()),
    Detector("pypi_token", "PyPI token", PypiTokenDetector()),
    Detector("square_oauth", "Square OAuth secret", SquareOAuthDetector()),
    Detector("discord_token", "Discord bot token", DiscordBotTokenDetector()),
    Detector("telegram_token", "Telegram bot token", TelegramBotTokenDetector()),
    Detector("azure_storage_key", "Azure storage key", AzureStorageKeyDetector()),
    Detector("artifactory_token", "Artifactory credential", ArtifactoryDetector()),
    Detector("ibm_cloud_iam_key", "IBM Cloud IAM key", IbmCloudIamDetector()),
    Detector("ibm_cos_hmac", "IBM COS HMAC credential", IbmCosHmacDetector()),
    Detector("softlayer_key", "SoftLayer credential", SoftlayerDetector()),
    Detector("cloudant_key", "Cloudant credential", CloudantDetector()),
    Detector("jwt", "JSON web token", JwtTokenDetector()),
    Detector("bearer_token", "bearer token", BearerTokenDetector()),
    Detector("url_password", "password in a URL", BasicAuthDetector()),
    KEYWORD,
)
#: The field named like a credential (no plugin: the key, not the value, says it).
NAMED_FIELD = Detector("credential_field", "field named like a credential", None)
LABELS = {d.type: d.label for d in (*DETECTORS, NAMED_FIELD)}

#: A JSON key naming a credential: the keyword plugin's denylist (``password``,
#: ``api_key``, ``secret``, ...; its own affix rule), and the header and OAuth names it
#: lacks. Keys are compared lower-cased with ``-`` read as ``_`` (``X-Api-Key``).
_KEY_NAME = re.compile(
    r"{denylist}|(?:access|refresh|id|auth|session|api|bearer)_?token"
    r"|authorization|cookie".format(denylist="|".join(_keyword.DENYLIST)))


def _placeholder(value: str) -> bool:
    """A value that stands for a credential without being one (detect-secrets' heuristic
    filters: ``${X}``, ``<x>``, ``{x}``, ``$X``, nothing alphanumeric)."""
    return (is_templated_secret(value) or is_prefixed_with_dollar_sign(value)
            or is_not_alphanumeric_string(value))


#: A lookahead or lookbehind without nested groups (the plugins' only kind).
_LOOKAROUND = re.compile(r"\(\?<?[=!][^()]*\)")
#: A repetition bound RE2 refuses (at most 1,000).
_BIG_BOUND = re.compile(r"\{(\d+),\d{4,}\}")
#: A pattern that begins with a literal (``BEGIN``, ``ghp_``, ``(glpat|gldt)-``, ...):
#: such patterns share one RE2 automaton cheaply; the others each get their own (OR-ed,
#: their counted character classes multiply RE2's states: 30x slower, measured).
_LITERAL_START = re.compile(r"\(?(?:\?:)?(?:[A-Za-z0-9_]|\\[./:-]){3}|\((?:\w+\|)+\w+\)")


def _widened(pattern: str) -> str:
    """``pattern`` as RE2 takes it, matching at least what it matched: lookarounds
    dropped (they only narrow a match), repetition bounds over 1,000 left open."""
    return _BIG_BOUND.sub(r"{\1,}", _LOOKAROUND.sub("", pattern))


def _prefilters() -> tuple:
    """``(RE2 pattern, detector types)`` pairs (linear time) that, between them, match
    every text a detector could match, and name the detectors a match may be theirs:
    each plugin pattern widened (``_widened``) with its flags, plus the keyword plugin's
    denylist words (its patterns hold backreferences, RE2 has none; each needs one of the
    words), on their own: prose says "password" often, and only the keyword plugin need
    run then. The patterns starting with a literal are OR-ed into the first; each other
    is its own. Multi-line (``(?m)``), so a match inside one string of a newline-joined text
    is a match of the joined text. Raises at import if RE2 refuses a pattern (a new
    plugin version: widen it here), so a prefilter never silently misses."""
    shared, shared_types = [], set()
    alone = [(_DENYLIST_WORDS.pattern, frozenset({KEYWORD.type}))]
    for detector in DETECTORS:
        if detector is KEYWORD:
            continue
        for regex in detector.plugin.denylist:
            if regex.flags & re.VERBOSE and re.search(r"\s|#", regex.pattern):
                raise ValueError(f"{detector.type}: a verbose pattern RE2 cannot read")
            flags = "mi" if regex.flags & re.IGNORECASE else "m"
            part = f"(?{flags}:{_widened(regex.pattern)})"
            if _LITERAL_START.match(regex.pattern):
                shared.append(part)
                shared_types.add(detector.type)
            else:
                alone.append((part, frozenset({detector.type})))
    return tuple((_re2(pattern), types)
                 for pattern, types in [("|".join(shared), frozenset(shared_types)), *alone])


_PREFILTERS = _prefilters()


@dataclass(frozen=True)
class Finding:
    """A credential-like value at ``path`` (an RFC 6901 JSON pointer) of type ``type``
    (a ``Detector.type`` word). Never holds the value."""

    path: str
    type: str

    def as_json(self) -> dict:
        """``{"path": ..., "type": ...}``, as stored on a row and answered in a 422."""
        return {"path": self.path, "type": self.type}

    @property
    def sentence(self) -> str:
        """'credential-like value at /headers/authorization (bearer token)'."""
        return sentence(self.as_json())


def sentence(finding: dict) -> str:
    """The words for a stored finding (``{"path", "type"}``): 'credential-like value at
    /headers/authorization (bearer token)'."""
    label = LABELS.get(finding.get("type"), finding.get("type"))
    return f"credential-like value at {finding.get('path') or '/'} ({label})"


#: What a finding's path shows for an object key that is itself credential-like, and
#: the longest key segment shown whole (a longer one is cut, with an ellipsis): a path
#: is made of the payload's keys, so it must never carry a credential or a long value.
KEY_REDACTED = "(credential-like key)"
KEY_SHOWN_CHARS = 64


def _pointer(parts: tuple, flagged_keys: frozenset | set = frozenset()) -> str:
    """The RFC 6901 JSON pointer of a path given as keys and indexes, for display: a key
    in ``flagged_keys`` is shown as ``KEY_REDACTED``, a key longer than
    ``KEY_SHOWN_CHARS`` is cut."""
    out = []
    for p in parts:
        text = str(p)
        if isinstance(p, str) and p in flagged_keys:
            text = KEY_REDACTED
        elif len(text) > KEY_SHOWN_CHARS:
            text = text[:KEY_SHOWN_CHARS] + "…"
        out.append("/" + text.replace("~", "~0").replace("/", "~1"))
    return "".join(out)


@lru_cache(maxsize=4096)
def _named_credential(key: str) -> bool:
    """Whether an object key names a credential (``_KEY_NAME``; keys repeat: cached)."""
    return _KEY_NAME.search(key.lower().replace("-", "_")) is not None


def _finders() -> dict[str, Any]:
    """Each detector's own plugin patterns, widened and OR-ed, in one RE2 program (not
    the keyword plugin's: ``KeywordAssignmentDetector`` finds its own places)."""
    out = {}
    for detector in DETECTORS:
        if detector is KEYWORD:
            continue
        parts = [f"(?{'i' if r.flags & re.IGNORECASE else ''}:{_widened(r.pattern)})"
                 for r in detector.plugin.denylist]
        out[detector.type] = _re2("|".join(parts))
    return out


_FINDERS = _finders()


def _found(detector: Detector, text: str) -> bool:
    """Whether ``detector``'s plugin finds a credential in ``text``. The plugin runs on
    windows of ``text``: ``WINDOW_MARGIN`` characters either side of each place its
    patterns (widened, by RE2) match, at most ``WINDOW_TRIES`` places; so a text of
    ``eyJ`` repeated 20,000 times (the JWT plugin's Python pattern is quadratic on it: a
    second for 60 KB, measured) costs one linear RE2 pass."""
    if detector is KEYWORD:
        return next(iter(detector.plugin.analyze_string(text)), None) is not None
    for n, match in enumerate(_FINDERS[detector.type].finditer(text)):
        if n >= WINDOW_TRIES:
            return False
        window = text[max(0, match.start() - WINDOW_MARGIN):match.end() + WINDOW_MARGIN]
        if next(iter(detector.plugin.analyze_string(window)), None) is not None:
            return True
    return False


def detect(text: str, types: frozenset | set | None = None) -> list[str]:
    """The detector types (of ``types``; ``None``: all) whose plugin finds a credential
    in ``text`` (its first ``SCAN_CHARS`` characters), in ``DETECTORS`` order, without
    repeats (``scan`` calls it with the detectors a prefilter named for the string)."""
    text = text[:SCAN_CHARS]
    return [d.type for d in DETECTORS
            if (types is None or d.type in types) and _found(d, text)]


def _strings(document: Any) -> list[tuple[tuple, str, bool, bool]]:
    """Every string of ``document`` in walk order (keys as stored, depth first), object
    keys included: its path, its first ``SCAN_CHARS`` characters, whether its key names a
    credential (values only), and whether it is an object key. Iterative: the payload's
    depth is bounded by the parser, not the stack."""
    out = []
    stack: list[tuple[tuple, Any, bool]] = [((), document, False)]
    while stack:
        parts, value, named = stack.pop()
        if isinstance(value, str):
            out.append((parts, value[:SCAN_CHARS], named, False))
        elif isinstance(value, dict):
            out.extend((parts + (k,), k[:SCAN_CHARS], False, True) for k in value)
            stack.extend((parts + (k,), v, _named_credential(k))
                         for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((parts + (i,), v, False) for i, v in reversed(list(enumerate(value))))
    return out


def _marked(texts: list[str]) -> dict[int, set[str]]:
    """Which of ``texts`` a prefilter matches, and the detectors it names: ``{index:
    types}``. The texts, UTF-8, joined by newlines, are searched by each prefilter
    from the text after the last one it marked; every text a match overlaps is marked (a
    match that hides another inside it overlaps that one's text too)."""
    if not texts:
        return {}
    encoded = [t.encode("utf-8", "surrogatepass") for t in texts]
    starts, at = [], 0
    for raw in encoded:
        starts.append(at)
        at += len(raw) + 1
    joined = b"\n".join(encoded)
    marked: dict[int, set[str]] = {}
    for prefilter, types in _PREFILTERS:
        pos = 0
        while (match := prefilter.search(joined, pos)) is not None:
            first = bisect.bisect_right(starts, match.start()) - 1
            last = bisect.bisect_right(starts, max(match.end() - 1, match.start())) - 1
            for i in range(first, last + 1):
                marked.setdefault(i, set()).update(types)
            if last + 1 >= len(starts):
                break
            pos = starts[last + 1]  # the texts it marked need no second look
    return marked


def _clear(document: Any) -> bool:
    """Whether ``scan`` is sure to find nothing in ``document``, decided without building
    a path per string (issue 22: most payloads hold no credential, and building every
    path cost half of ``scan``'s time): no member named like a credential holds a value
    that counts (``scan``'s rule for ``credential_field``), and no prefilter matches any
    of the strings ``scan`` would search (values and keys of ``MIN_CHARS`` and more, cut
    at ``SCAN_CHARS``). The prefilters match every text a detector can match, so when
    none matches no detector runs in ``scan`` either. False means only "look closer"."""
    texts: list[str] = []
    stack: list[tuple[Any, bool]] = [(document, False)]
    while stack:
        value, named = stack.pop()
        if isinstance(value, str):
            text = value[:SCAN_CHARS]
            if named and text.strip() and not _placeholder(text):
                return False
            if len(text) >= MIN_CHARS:
                texts.append(text)
        elif isinstance(value, dict):
            for key, item in value.items():
                if len(key) >= MIN_CHARS:
                    texts.append(key[:SCAN_CHARS])
                stack.append((item, _named_credential(key)))
        elif isinstance(value, list):
            stack.extend((item, False) for item in value)
    return not _marked(texts)


def scan(document: Any) -> list[Finding]:
    """The credential-like values of a parsed JSON ``document`` (a payload, a receipt,
    an effect's request): one ``Finding`` per (path, type), in walk order, at most
    ``MAX_FINDINGS``. A string of at least ``MIN_CHARS`` characters that a prefilter
    marks is run through every detector's plugin (``detect``); an object member whose key
    names a credential and whose value is a non-empty string that is not a placeholder
    is one finding of ``credential_field`` (unless a detector already named its type).
    Object keys are scanned as values are: a credential-like key is a finding at its own
    path, shown as ``KEY_REDACTED`` there and in every path under it (``_pointer``).
    Never raises on JSON values; never returns a value. A document ``_clear`` vouches
    for is answered at once (``scan_all`` is the whole walk, which a test holds it to)."""
    return [] if _clear(document) else scan_all(document)


def scan_all(document: Any) -> list[Finding]:
    """``scan`` without the ``_clear`` shortcut: the walk that names each finding's path."""
    strings = _strings(document)
    long = [i for i, (_, text, _, _) in enumerate(strings) if len(text) >= MIN_CHARS]
    marked = {long[j]: types for j, types in _marked([strings[i][1] for i in long]).items()}
    typed = []
    for i, (_, text, named, _) in enumerate(strings):
        types = detect(text, marked[i]) if i in marked else []
        if named and not types and text.strip() and not _placeholder(text):
            types = [NAMED_FIELD.type]
        typed.append(types)
    # A key found credential-like is a finding of its own, and never shown in a path.
    flagged_keys = {text for (_, text, _, is_key), types in zip(strings, typed, strict=True)
                    if is_key and types}
    found: list[Finding] = []
    for (parts, _, _, _), types in zip(strings, typed, strict=True):
        found.extend(Finding(_pointer(parts, flagged_keys), t) for t in types)
        if len(found) >= MAX_FINDINGS:
            break
    return found[:MAX_FINDINGS]


def as_json(findings: list[Finding]) -> list[dict]:
    """The findings as stored on a row (``Checkpoint.secret_paths``, ...)."""
    return [f.as_json() for f in findings]
