"""The test settings plus an app whose queues.py fails to import.

Only worker subprocesses started by tests/test_worker_cli.py use this module.
"""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.brokenapp"]
