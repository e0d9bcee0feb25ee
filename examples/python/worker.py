#!/usr/bin/env python3
"""A sluice worker in Python, speaking the worker protocol over HTTP.

Standard library only. It registers for the kinds in HANDLERS, long-polls
for tasks, runs each in a child process, heartbeats, and reports each
result. The protocol's types and rules are documented in the Go package
`protocol` (protocol/doc.go) and in openapi.yaml.

    SLUICE_SERVER=http://127.0.0.1:8080 SLUICE_TOKEN=<worker token> \\
        python3 examples/python/worker.py

    sluice enqueue slow --input '{"seconds": 5}' --timeout 2s --wait

Timeouts. A claimed task carries its `timeout` ("30s"; "0s" for none),
counted from the server's record of the attempt's start. The worker must
enforce it: the server cannot stop a handler. Here each attempt runs in a
child process, which is killed at the timeout, and the worker reports a
failed result ("timeout: attempt exceeded 30s", without no_retry, so that
the task is retried while attempts remain). The server does not wait for
that report: it ends the attempt at its first sweep after the timeout, and
its heartbeat answers list the task in `cancel` from the timeout on. A
handler in a thread could not be stopped, and would keep running, and
holding its slot, past its timeout.
"""

import json
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

SERVER = os.environ.get("SLUICE_SERVER", "http://127.0.0.1:8080").rstrip("/")
TOKEN = os.environ.get("SLUICE_TOKEN", "")
SLOTS = int(os.environ.get("SLUICE_SLOTS", "4"))


# Handlers: kind → function(input) → output (any JSON value). Raise to
# fail the attempt. They run in a child process, so they must be
# module-level functions. (The built-in kinds, such as sleep and echo,
# are served by `sluice worker`.)
def slow(inp):
    n = float((inp or {}).get("seconds", 1))
    time.sleep(n)
    return {"slept": n}


def upper(inp):
    return str(inp).upper()


HANDLERS = {"slow": slow, "upper": upper}


class CallError(Exception):
    def __init__(self, status, body):
        super().__init__(f"HTTP {status}: {body}")
        self.status = status


def call(method, path, body=None, timeout=70):
    """Sends one request; returns the decoded JSON answer (None for 204)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(SERVER + path, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if TOKEN:
        req.add_header("Authorization", "Bearer " + TOKEN)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        raise CallError(e.code, e.read().decode(errors="replace")) from None
    return json.loads(raw) if raw else None


_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def seconds(duration):
    """Reads a Go duration string ("1.5s", "250ms", "1h2m", "0s")."""
    if duration in ("", "0", "0s"):
        return 0.0
    sign = -1 if duration.startswith("-") else 1
    rest = duration.lstrip("+-")
    total, pos = 0.0, 0
    for m in _PART.finditer(rest):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(rest) or pos == 0:
        raise ValueError(f"not a duration: {duration!r}")
    return sign * total


def _child(kind, inp, conn):
    """Runs one handler in the child process and sends back its outcome."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    try:
        conn.send(("ok", HANDLERS[kind](inp)))
    except BaseException as e:  # noqa: BLE001 - any failure is the task's
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


class Run:
    """One claimed attempt."""

    def __init__(self, task):
        self.task = task
        self.cancelled = threading.Event()  # the server said cancel
        self.lost = threading.Event()  # the server said lost: drop the result


class Worker:
    def __init__(self):
        self.lock = threading.Condition()  # notified when a slot frees
        self.runs = {}  # task id → Run: the tasks held, one slot each
        self.stopping = threading.Event()
        methods = multiprocessing.get_all_start_methods()
        self.mp = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        reg = call("POST", "/v1/workers", {"name": f"python-{os.getpid()}", "kinds": sorted(HANDLERS), "slots": SLOTS})
        self.id = reg["id"]
        self.heartbeat_every = seconds(reg["heartbeat_interval"])
        print(f"registered as worker {self.id}", file=sys.stderr)

    def heartbeats(self):
        while not self.stopping.wait(self.heartbeat_every):
            with self.lock:
                held = list(self.runs)
            try:
                res = call("POST", f"/v1/workers/{self.id}/heartbeat", {"held": held, "free_slots": SLOTS - len(held)})
            except (OSError, CallError) as e:
                print(f"heartbeat failed: {e}", file=sys.stderr)
                continue
            with self.lock:
                for tid in res.get("lost") or []:
                    if tid in self.runs:
                        self.runs[tid].lost.set()
                # Cancelled tasks, and tasks past their timeout.
                for tid in res.get("cancel") or []:
                    if tid in self.runs:
                        self.runs[tid].cancelled.set()

    def execute(self, run):
        task = run.task
        timeout = seconds(task.get("timeout") or "0s")
        deadline = time.monotonic() + timeout if timeout > 0 else None
        parent, child = self.mp.Pipe(duplex=False)
        proc = self.mp.Process(target=_child, args=(task["kind"], task["input"], child), daemon=True)
        proc.start()
        child.close()
        result = None
        try:
            while result is None:
                wait = 0.1
                if deadline is not None:
                    wait = max(0.0, min(wait, deadline - time.monotonic()))
                if parent.poll(wait):
                    try:
                        status, value = parent.recv()
                    except EOFError:
                        status, value = "error", f"handler process exited with code {proc.exitcode}"
                    result = {"output": value} if status == "ok" else {"error": value}
                elif deadline is not None and time.monotonic() >= deadline:
                    # Enforce the timeout: stop the handler, report it.
                    result = {"error": f"timeout: attempt exceeded {task['timeout']}"}
                elif run.lost.is_set() or self.stopping.is_set():
                    return  # not ours any more, or released at shutdown
                elif run.cancelled.is_set():
                    # No no_retry: a requested cancellation ends the task
                    # anyway, and a cancel that came for the timeout
                    # (the server's clock started a little before ours)
                    # must leave the task to be retried.
                    result = {"error": "cancelled"}
        finally:
            if proc.is_alive():
                proc.kill()
            proc.join()
            parent.close()
            if result is None:
                self.forget(task["id"])
        result.update(task_id=task["id"], attempt=task["attempt"])
        try:
            ack = call("POST", f"/v1/workers/{self.id}/complete", {"results": [result]})
            if ack["results"][0]["status"] != "ok":
                print(f"task {task['id']}: result not taken ({ack['results'][0]['status']})", file=sys.stderr)
        except (OSError, CallError) as e:
            print(f"task {task['id']}: completing failed: {e}", file=sys.stderr)
        finally:
            self.forget(task["id"])

    def forget(self, tid):
        with self.lock:
            if self.runs.pop(tid, None) is not None:
                self.lock.notify()

    def run(self):
        threading.Thread(target=self.heartbeats, daemon=True).start()
        while not self.stopping.is_set():
            with self.lock:
                while len(self.runs) >= SLOTS:
                    self.lock.wait()
                n = SLOTS - len(self.runs)
            try:
                res = call("POST", f"/v1/workers/{self.id}/claim", {"max": n, "wait": "30s"})
            except (OSError, CallError) as e:
                print(f"claim failed: {e}", file=sys.stderr)
                time.sleep(1)
                continue
            for tid in res.get("cancel") or []:
                with self.lock:
                    if tid in self.runs:
                        self.runs[tid].cancelled.set()
            for task in res["tasks"]:
                run = Run(task)
                with self.lock:
                    self.runs[task["id"]] = run
                threading.Thread(target=self.execute, args=(run,), daemon=True).start()

    def stop(self):
        """Stops the handlers and leaves: the server ends their attempts
        as if the lease expired, to be retried elsewhere."""
        self.stopping.set()
        try:
            call("DELETE", f"/v1/workers/{self.id}")
        except (OSError, CallError) as e:
            print(f"leaving: {e}", file=sys.stderr)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main():
    signal.signal(signal.SIGTERM, _interrupt)
    w = Worker()
    try:
        w.run()
    except KeyboardInterrupt:
        w.stop()


if __name__ == "__main__":
    main()
