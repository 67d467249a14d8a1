"""The Celery app of a fleet: the broker, one task, its delivery guarantees.

Celery does the moving: a durable broker (Redis with an append-only file)
keeps each machine's queue across restarts of anything; a message is
acknowledged only after its trial (acks_late), a pool process killed
mid-trial puts its message back (reject_on_worker_lost), and a worker with
concurrency 1 and prefetch 1 holds no second trial while one runs.  The store,
not Celery, says what a trial's state is: a message only says "run trial T of
experiment E", so a message delivered twice runs nothing twice (the worker
claims the trial first).  Results never travel through Celery.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mmlab.errors import MmlabError
from mmlab.fleet import queue
from mmlab.store.backend import redacted

TASK = "mmlab.trial"     # args: experiment id, trial id, host changes allowed


def app(broker: str) -> Any:
    """A Celery app for `broker` (redis://host:port/db)."""
    try:
        from celery import Celery
    except ImportError as exc:
        raise MmlabError("fleet commands need celery (pip install -e '.[fleet]', "
                         "or make setup)") from exc
    made = Celery("mmlab", broker=broker, set_as_current=False)
    made.conf.update(
        task_acks_late=True, task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1, worker_concurrency=1,
        task_ignore_result=True, task_serializer="json", accept_content=["json"],
        task_create_missing_queues=True, broker_connection_retry_on_startup=True,
        broker_connection_timeout=5, worker_hijack_root_logger=False)
    return made


def on_process_exit(release: Callable[[], None]) -> None:
    """`release` called in the worker's pool process as it ends (a warm
    shutdown): what a trial's target keeps up outside it, a bare-metal
    machine, ends with it rather than outliving the worker."""
    from celery.signals import worker_process_shutdown
    worker_process_shutdown.connect(lambda **_: release(), weak=False)


def reachable(celery: Any) -> None:
    """Refuse early, in one line, when the broker does not answer."""
    try:
        with celery.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:   # kombu raises its transport's own errors
        raise MmlabError(f"broker {redacted(celery.conf.broker_url)}: cannot connect "
                         f"({exc})") from exc


def send(celery: Any, machine: str, exp_id: int, trial_id: int, allow_host_changes: bool) -> str:
    """Put one trial on its machine's queue; returns the message's task id."""
    return celery.send_task(TASK, args=[exp_id, trial_id, allow_host_changes],
                            queue=queue(machine)).id


def revoke(celery: Any, task_ids: list[str]) -> None:
    """Queued trials a stopped run no longer wants: workers drop them on arrival."""
    if task_ids:
        celery.control.revoke(task_ids)


def active(celery: Any, timeout: float = 1.0) -> dict[str, set[int]]:
    """Every worker that answers within `timeout`: its node name and the
    trial ids it is running now."""
    replies = celery.control.inspect(timeout=timeout).active() or {}
    return {node: {int(task["args"][1]) for task in tasks
                   if task.get("name") == TASK and len(task.get("args") or ()) > 1}
            for node, tasks in replies.items()}


def queue_length(celery: Any, machine: str) -> int:
    """Messages waiting in a machine's queue (not those being run).  Not a
    passive declare: Redis has no key for an empty queue."""
    with celery.connection_for_read() as conn:
        return conn.default_channel.queue_declare(queue(machine)).message_count
