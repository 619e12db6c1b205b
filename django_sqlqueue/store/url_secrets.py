"""Keeping a database URL's password out of every text: errors, log lines, reprs.

A password may hold any character, and an unencoded ``/``, ``?``, ``#`` or ``@`` ends
``urlsplit()``'s host part early, so it finds no password at all. The password here is
what lies between the user name's ``:`` and the URL's last ``@``: a user name holds none of
``:/?#@``, and a password's own ``@`` comes before the host's. Reading too much as the
password (a query string holding an ``@``) hides too much; reading too little would show it.
"""

from __future__ import annotations

import re
from urllib.parse import quote, unquote

HIDDEN = "***"
# scheme://user:password@rest, the password running to the last "@".
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:/?#@]*):(?P<password>.*)@(?P<rest>.*)",
                       re.DOTALL)


def password_of(url: str) -> str | None:
    """The password as written in ``url`` (percent-encoding kept), or None."""
    if not isinstance(url, str):
        return None
    match = _USERINFO.fullmatch(url)
    return match["password"] if match and match["password"] else None


def redact(url: str) -> str:
    """``url`` with its password replaced by ``***``, for messages and logs."""
    if not isinstance(url, str):
        return "<not a url>"
    match = _USERINFO.fullmatch(url)
    if match and match["password"]:
        return f"{match['head']}:{HIDDEN}@{match['rest']}"
    return hide(url, url)  # a password only django-environ finds


def hide(text: str, url: str) -> str:
    """``text`` with every spelling of ``url``'s password replaced by ``***``: as written,
    percent-decoded (what a driver is given), percent-encoded, and as django-environ reads it."""
    for spelling in sorted(_spellings(url), key=len, reverse=True):
        text = text.replace(spelling, HIDDEN)
    return text


def _spellings(url: str) -> set[str]:
    found = set()
    written = password_of(url)
    if written:
        found |= {written, unquote(written), quote(unquote(written), safe="")}
    try:
        # django-environ comes with the spark extra, the only reader of urls: without it
        # the written forms are all there is to hide.
        import environ

        read = environ.Env.db_url_config(url).get("PASSWORD")
    except Exception:  # noqa: BLE001, S110 - an unreadable url: the written form is all there is
        read = None
    if isinstance(read, str) and read:
        found |= {read, quote(read, safe="")}
    return {s for s in found if s and s != HIDDEN}
