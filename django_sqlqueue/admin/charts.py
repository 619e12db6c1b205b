"""The overview's pictures, drawn on the server as inline SVG: no script, no CDN, no
static files. A sparkline of messages handled per minute, and a bar for lag."""

from __future__ import annotations

import math
from collections.abc import Sequence

from django.utils.html import format_html
from django.utils.safestring import SafeString

SPARK_WIDTH = 180  # px; one point per minute over the last hour
SPARK_HEIGHT = 28
BAR_WIDTH = 160
BAR_HEIGHT = 14
LINE = "#417690"  # Django admin's header blue
LAG_COLOUR = "#ba2121"  # the admin's error red
NO_LAG_COLOUR = "#2e7d32"


def sparkline(per_minute: Sequence[int], width: int = SPARK_WIDTH,
              height: int = SPARK_HEIGHT) -> SafeString:
    """Counts per minute, oldest first, as a line; its title gives the total and peak."""
    values = [max(0, int(v)) for v in per_minute] or [0]
    peak = max(values)
    step = width / max(1, len(values) - 1)
    points = " ".join(
        f"{i * step:.1f},{height - 2 - (v / peak * (height - 4) if peak else 0):.1f}"
        for i, v in enumerate(values))
    total = sum(values)
    label = (f"{total} handled in the last {len(values)} minutes, "
             f"at most {peak} in a minute")
    return format_html(
        '<svg class="sqlqueue-spark" width="{}" height="{}" viewBox="0 0 {} {}" role="img" '
        'aria-label="{}"><title>{}</title>'
        '<line x1="0" y1="{}" x2="{}" y2="{}" stroke="#ddd" stroke-width="1"/>'
        '<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/></svg>',
        width, height, width, height, label, label, height - 1, width, height - 1, LINE, points)


def lag_bar(lag: int, largest: int, width: int = BAR_WIDTH, height: int = BAR_HEIGHT) -> SafeString:
    """A bar as long as ``lag`` on a log scale up to ``largest`` (the page's largest lag),
    so a lag of 10 still shows next to one of a million; green and empty at 0."""
    lag, largest = max(0, int(lag)), max(1, int(largest))
    fraction = math.log10(1 + lag) / math.log10(1 + largest) if lag else 0.0
    filled = max(2.0, fraction * width) if lag else 0.0
    colour = LAG_COLOUR if lag else NO_LAG_COLOUR
    label = f"lag {lag}"
    return format_html(
        '<svg class="sqlqueue-lag" width="{}" height="{}" viewBox="0 0 {} {}" role="img" '
        'aria-label="{}"><title>{}</title>'
        '<rect x="0" y="0" width="{}" height="{}" fill="#eee"/>'
        '<rect x="0" y="0" width="{}" height="{}" fill="{}"/>'
        '<rect x="0" y="0" width="{}" height="{}" fill="none" stroke="{}" stroke-width="1"/>'
        '</svg>',
        width, height, width, height, label, label, width, height, f"{filled:.1f}", height, colour,
        width, height, colour)
