"""No secret in text: a database password, whatever characters it holds, and a rejected
METRICS_TOKEN never appear in anything the package formats: errors for bad URLs or failed
connections, the Spark options' repr, log lines, system check messages.

Each planted password is looked for in every spelling (as written, percent-decoded,
percent-encoded) and in pieces: a parser that stops at a '/' once quoted the part before it.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import quote, unquote

import pytest
from django.conf import settings
from django.core.checks import run_checks
from django.test import override_settings

from django_sqlqueue.spark.options import parse
from django_sqlqueue.store.connection import ConnectFailed, open_connection, parse_url, redact

# Written into the url as they are; the last one percent-encoded ('@', '/', '?', '#').
PASSWORDS = ["Tr0ub/4dor-x", "s3cr?t-pw42", "pa#ss-word", "p@ss@word9", "p%40ss%2Fw%3Fr%23d7"]
# Nothing listens on port 1: every connection attempt fails at once.
URLS = [f"{scheme}://app:{password}@127.0.0.1:1/prod"
        for scheme in ("mysql", "postgres") for password in PASSWORDS]


def spellings(password: str) -> set[str]:
    decoded = unquote(password)
    pieces = {p for p in re.split(r"[/?#@%]", decoded) if len(p) >= 4}
    return {password, decoded, quote(decoded, safe=""), *pieces}


def leaks(text: str, password: str) -> set[str]:
    return {spelling for spelling in spellings(password) if spelling in text}


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG, logger="django_sqlqueue")
    return caplog


def formatted(url: str) -> list[str]:
    """Everything the package says about ``url``: redact(), the errors of reading it and of
    connecting, and the Spark options' repr. (parse_url()'s own result is the connection's
    settings, password included, as Django's DATABASES entry has it.)"""
    texts = [redact(url)]
    for attempt in (lambda: parse_url(url), lambda: parse({"url": url, "topic": "orders"}),
                    lambda: open_connection(url)):
        try:
            made = attempt()
        except Exception as exc:  # noqa: BLE001 - every error's text is looked at
            texts += [str(exc), repr(exc), str(exc.__cause__ or ""), str(exc.__context__ or "")]
        else:
            if not isinstance(made, dict):
                texts += [repr(made), str(made)]
    return texts


@pytest.mark.parametrize("url", URLS)
def test_a_password_with_any_characters_is_never_shown(url, logs):
    password = url.split("app:", 1)[1].rsplit("@", 1)[0]
    texts = formatted(url) + [record.getMessage() for record in logs.records]
    assert redact(url) == url.replace(password, "***")
    for text in texts:
        assert not leaks(text, password), text


@pytest.mark.parametrize("url", URLS)
def test_a_connection_failure_names_the_url_without_its_password(url):
    with pytest.raises(ConnectFailed) as failure:
        open_connection(url)
    assert "app:***@127.0.0.1:1" in str(failure.value)


def test_the_spark_options_hide_a_password_in_any_spelling():
    options = parse({"url": "postgres://u:p%40ss%2Fx@127.0.0.1:5432/db", "topic": "orders"})
    assert options.hide("auth failed for p@ss/x (p%40ss%2Fx)") == "auth failed for *** (***)"
    assert "p%40ss" not in repr(options) and "u:***@127.0.0.1:5432/db" in repr(options)


@pytest.mark.parametrize("token", [
    "Zq8-prod-metrics-secret-7f3a9c1e\n",  # read from a secrets file, newline kept
    "short-secret",
    "has spaces in the prod metrics secret",
    "prod-metrics-sécret-7f3a9c1e",
])
def test_a_rejected_metrics_token_is_described_never_printed(token):
    with override_settings(SQLQUEUE={**settings.SQLQUEUE, "METRICS_TOKEN": token}):
        messages = run_checks(tags=["sqlqueue"])
    [error] = [m for m in messages if m.id == "sqlqueue.E071"]
    assert f"a string of {len(token)} characters" in error.msg
    for message in messages:
        text = f"{message.msg} {message.hint} {message}"
        assert token.strip() not in text
        assert not [piece for piece in token.split() if len(piece) >= 10 and piece in text]


def test_a_token_read_from_a_file_is_told_to_be_stripped():
    with override_settings(SQLQUEUE={**settings.SQLQUEUE,
                                     "METRICS_TOKEN": "Zq8-prod-metrics-secret-7f3a9c1e\n"}):
        [error] = [m for m in run_checks(tags=["sqlqueue"]) if m.id == "sqlqueue.E071"]
    assert "line break" in error.msg
