"""Task limits: ``task_options(concurrency_key=…, max_running=…)`` holds per key across
worker processes, measured from the tasks' own logs; bad limits are refused at decoration."""

from __future__ import annotations

import pytest

from django_sqlqueue.exceptions import ConfigurationError
from django_sqlqueue.tasks import task_options
from django_sqlqueue.tasks.compat import InvalidTask
from tests.test_limits import peak, runs
from tests.testapp import tasks
from tests.worker_harness import wait_until, worker_pool


@pytest.fixture
def workers(transactional_db, tmp_path):  # type: ignore[no-untyped-def]
    with worker_pool(tmp_path) as pool:
        yield pool


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
@pytest.mark.compat
def test_max_running_holds_per_concurrency_key_across_workers(workers, tmp_path):
    log = tmp_path / "runs.log"
    for account_id in (1, 2):
        for _ in range(8):
            tasks.sync_account.enqueue(account_id, str(log), 0.2)
    for _ in range(4):
        tasks.one_at_a_time.enqueue(str(log))
    started = [workers.start(f"tasks-limits-{i}", "--queue", "default", "--concurrency", "4")
               for i in range(2)]

    found = wait_until(lambda: len(runs(log)) >= 20 and runs(log), timeout=60,
                       what="every limited task run", watch=started)
    assert peak([r for r in found if r.key == "account:1"]) == 2
    assert peak([r for r in found if r.key == "account:2"]) == 2
    assert peak([r for r in found if r.key == "single"]) == 1


def test_a_concurrency_key_must_name_parameters_of_the_task():
    with pytest.raises(ValueError, match=r"names \{customer\}, but .* has no parameter 'customer'"):
        task_options(concurrency_key="customer:{customer}", max_running=1)(lambda account_id: None)


@pytest.mark.parametrize("options, problem", [
    ({"max_running": 0}, "max_running must be an int >= 1"),
    ({"rate": "fast"}, "rate must look like '100/s'"),
    ({"rate": "0/m"}, "rate must allow at least one start"),
    ({"concurrency_key": "account:{account_id}"}, "concurrency_key needs max_running or rate"),
    ({"concurrency_key": "", "max_running": 1}, "concurrency_key must be a non-empty string"),
])
def test_bad_task_limits_are_refused_when_decorating(options, problem):
    with pytest.raises(ValueError, match=problem) as caught:
        task_options(**options)(lambda account_id: None)
    assert isinstance(caught.value, InvalidTask | ConfigurationError)
