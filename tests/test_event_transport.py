"""The events transport (trainers.events) of a job process: each typed event is one
``RAYDOCK_EVENT`` log line and one POST to the launch's events URL, the same JSON on
both channels; a report's odd values never cost the whole report."""

from __future__ import annotations

import http.server
import json
import math
import os
import subprocess
import sys
import threading

from api.cluster_contract import LAUNCH_URI_ENV
from api.schemas import MetricEvent, parse_event
from api.schemas.events import SUBMISSION_HEADER
from trainers.events import sendable_metrics

EMIT = """
import numpy as np
from api.schemas import MetricEvent, StartedEvent
from trainers import events
events.emit(StartedEvent(type="started", seq=0))
events.emit(MetricEvent(type="metric", seq=3, metrics=events.sendable_metrics({"loss": np.float32(0.5), "acc": float("nan")})))
events.flush()
"""


def test_events_go_to_the_log_and_to_the_server_with_the_token():
    received: list[tuple[str, dict]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.headers.get("Authorization"), json.loads(body)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {
            **os.environ,
            "RAYDOCK_EVENTS_URL": f"http://127.0.0.1:{server.server_port}/events",
            "RAYDOCK_EVENTS_TOKEN": "tok",
        }
        run = subprocess.run([sys.executable, "-c", EMIT], env=env, capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    assert run.returncode == 0, run.stderr
    logged = [
        json.loads(line.split("RAYDOCK_EVENT ", 1)[1]) for line in run.stdout.splitlines() if "RAYDOCK_EVENT {" in line
    ]
    assert [e["type"] for e in logged] == ["started", "metric"]
    assert all(isinstance(body, list) for _, body in received)  # a post carries a batch: what queued up meanwhile
    assert [event for _, body in received for event in body] == logged
    assert {auth for auth, _ in received} == {"Bearer tok"}
    metric = parse_event(logged[1])
    assert metric.seq == 3 and metric.ts > 0
    assert metric.metrics == {"loss": 0.5, "acc": "nan"}


def test_values_the_server_would_refuse_are_left_out_not_the_report():
    kept = sendable_metrics(
        {"loss": 0.25, "step": 3, "note": "ok", "nested": {"a": 1}, "long": "x" * 2000, "k" * 300: 1, "inf": math.inf}
    )
    assert kept == {"loss": 0.25, "step": 3, "note": "ok", "inf": "inf"}
    assert MetricEvent(type="metric", seq=0, metrics=kept).metrics == kept  # valid as the contract has it


DRIVER = """
import pickle, sys
from trainers.callbacks import ReportEvents
from trainers.launch import take_launch
take_launch()
with open(sys.argv[1], "wb") as f:
    pickle.dump(ReportEvents(), f)  # as Ray hands the callbacks to the Train controller
"""
CONTROLLER = """
import pickle, sys
from trainers import events
with open(sys.argv[1], "rb") as f:
    callback = pickle.load(f)
callback.after_report(None, [{"loss": 0.25}], None)
events.flush()
"""


def test_the_controller_pushes_with_the_channel_the_driver_handed_it(tmp_path):
    """The driver deletes the launch file; the controller, started after, still posts with
    the attempt's token and names the attempt's submission id."""
    received: list[tuple[str, str, list]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - the stdlib's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.headers.get("Authorization"), self.headers.get(SUBMISSION_HEADER), json.loads(body)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    launch = tmp_path / "_raydock" / "launch-1.json"
    launch.parent.mkdir()
    url = f"http://127.0.0.1:{server.server_port}/events"
    written = {"job_id": "j1", "attempt": 1, "storage_path": str(tmp_path), "spec": {}}
    launch.write_text(json.dumps({**written, "events_url": url, "events_token": "tok", "submission_id": "sid-1"}))
    env = {**os.environ, LAUNCH_URI_ENV: str(launch)}
    callbacks = tmp_path / "callbacks.pickle"
    try:
        for code in (DRIVER, CONTROLLER):
            run = subprocess.run(
                [sys.executable, "-c", code, str(callbacks)], env=env, capture_output=True, text=True, timeout=120
            )
            assert run.returncode == 0, run.stderr
            assert not launch.exists()
    finally:
        server.shutdown()
    assert [(auth, sid, [e["type"] for e in body]) for auth, sid, body in received] == [
        ("Bearer tok", "sid-1", ["metric"])
    ]
