"""The test settings of a later release, for rolling-deploy tests: a task module
(``tests/release2/newtasks.py``, importable as ``newtasks`` only here) and a task queue
("reports") that the test settings' release does not have."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.settings import *  # noqa: F403
from tests.settings import SQLQUEUE, TASKS

sys.path.insert(0, str(Path(__file__).resolve().parent / "release2"))

TASKS = {"default": {**TASKS["default"],
                     "QUEUES": [*TASKS["default"]["QUEUES"], "reports"]}}
# A task module outside any app's tasks module is known only when listed.
SQLQUEUE = {**SQLQUEUE, "TASK_MODULES": ["newtasks"]}
