"""The row's deadline (a DAG node's override included) travels as the message's Celery time
limits; a message without one carries none."""

from __future__ import annotations

from celery import Celery

from harvest_celery._runtime.celery import CeleryDispatcher
from harvest_celery._runtime.messages import TIME_LIMIT_HEADER, Message


class RecordingApp(Celery):  # a real Celery app whose broker call is recorded, not made
    def __init__(self):
        super().__init__("record", broker="memory://")
        self.sent: list[dict] = []

    def send_task(self, name, **kwargs):
        self.sent.append({"name": name, **kwargs})


def test_a_deadline_becomes_soft_and_hard_time_limits():
    app = RecordingApp()
    CeleryDispatcher(app).send(
        Message("charge", "payments", ["r", "1", 1], "r:1:1", {TIME_LIMIT_HEADER: 10.0})
    )
    CeleryDispatcher(app).send(Message("charge", "payments", ["r", "2", 1], "r:2:1", None))
    assert app.sent[0]["soft_time_limit"] == 10.0 and app.sent[0]["time_limit"] == 15.0
    assert "soft_time_limit" not in app.sent[1] and app.sent[1]["queue"] == "payments"


def test_a_dag_nodes_start_to_close_override_reaches_the_message(tmp_path):
    from harvest_celery import DagBuilder, Harvest, activity, dag
    from harvest_celery._runtime.inline import InlineDispatcher

    @activity(name="no_deadline")
    def no_deadline(x):
        return x

    @dag(name="override_dag")
    def override_dag(g: DagBuilder) -> None:
        g.activity(no_deadline).start_to_close(7)

    h = Harvest(f"sqlite:///{tmp_path / 'd.db'}").register(no_deadline, override_dag)
    h.migrate()
    h._inline = None
    h.runtime.dispatcher = InlineDispatcher()
    run_id = h.start_workflow("override_dag", {})
    h.runtime.run_decision(run_id)
    sent = [m for m in h.runtime.dispatcher.queue if m.task_name == "no_deadline"]
    assert sent[0].headers == {TIME_LIMIT_HEADER: 7.0}
    assert h.store.activity_rows(run_id)[0]["start_to_close"] == 7.0
