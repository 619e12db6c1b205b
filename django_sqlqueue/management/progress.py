"""A progress bar on stderr for long replays and discards: redrawn in place on a terminal,
a line per tenth otherwise (a log file gets ten lines, not a thousand)."""

from __future__ import annotations

from typing import Any

MIN_TOTAL = 1000  # smaller selections finish too fast to need one
WIDTH = 30


class ProgressBar:
    def __init__(self, stream: Any, label: str) -> None:
        self.stream = stream
        self.label = label
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self._shown_tenth = -1
        self._drawn = False

    def update(self, done: int, total: int) -> None:
        if total < MIN_TOTAL:
            return
        filled = WIDTH * done // total
        text = f"{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {done}/{total}"
        if self.tty:
            self.stream.write("\r" + text, ending="")
            self.stream.flush()
            self._drawn = True
            return
        tenth = 10 * done // total
        if tenth > self._shown_tenth:
            self._shown_tenth = tenth
            self.stream.write(text)

    def finish(self) -> None:
        if self._drawn:
            self.stream.write("")
