"""Embedded mode's dispatcher: messages go to an in-process queue that ``drain`` executes, each
activity through the one claim path."""

from __future__ import annotations

from collections import deque

from harvest_celery._core.registry import Registry
from harvest_celery._runtime.claim import claim_and_run
from harvest_celery._runtime.messages import DECIDE_TASK, Message, activity_ref
from harvest_celery._runtime.runtime import Runtime


class InlineDispatcher:
    def __init__(self) -> None:
        self.queue: deque[Message] = deque()

    def send(self, message: Message) -> None:
        self.queue.append(message)

    def drain(self, runtime: Runtime, registry: Registry) -> None:
        """Run every queued decision and activity in this process."""
        while self.queue:
            message = self.queue.popleft()
            if message.task_name == DECIDE_TASK:
                runtime.run_decision(message.args[0])
                continue
            definition = registry.activity(message.task_name)
            ref = activity_ref(message.args, message.headers)
            if ref is not None and definition.fn is not None:
                _ran, error = claim_and_run(runtime, *ref, definition.fn)
                if error is not None and not isinstance(error, Exception):
                    raise error  # a BaseException from a body: recorded, then it goes on
