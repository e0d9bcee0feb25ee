#!/usr/bin/env python3
"""The Python worker that test/python drives: examples/python's library
with the handlers the checks need. It registers the kinds named in
SLUICE_TEST_KINDS (comma-separated); the rest of its settings come from
the library's environment variables (SLUICE_SERVER, SLUICE_NAME, …)."""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "examples", "python"))

from sluice_worker import Worker, setup_logging  # noqa: E402

NAME = os.environ.get("SLUICE_NAME", "")


def timed(task, seconds):
    """Sleeps like a task's work, and says when it ran (wall clock, which
    every process on the machine shares)."""
    start = time.time()
    task.sleep(seconds)
    return {"start": start, "end": time.time(), "worker": NAME, "attempt": task.attempt}


def limited(task):
    return timed(task, 0.5)


def split(task):
    return list(range(1, int(task.input["n"]) + 1))


def item(task):
    out = timed(task, 0.5)
    out["n"] = int(task.input["n"])
    return out


def total(task):
    return sum(int(i["n"]) for i in task.input["items"])


def parent(task):
    # The child runs on the parent's queue: with a limit of 1 it can only
    # start on the slot the waiting parent lends it, and with one slot on
    # this worker only if the wait lends the worker's slot too.
    return task.run_child("py_child", {"x": task.input["x"]}, queue=task.queue, max_attempts=1) + 1


def child(task):
    return task.input["x"] + 1


def parent_bad(task):
    return task.run_child("py_bad", {}, max_attempts=1)


def bad(task):
    raise ValueError("boom")


def echo(task):
    return {"input": task.input, "attempt": task.attempt}


def sleepy(task):
    task.sleep(30)  # cooperative: cancelled at the timeout
    return "woke up"


def stubborn(task):
    time.sleep(30)  # ignores the cancellation: abandoned at the timeout
    return "woke up"


def sleepy_proc(task):
    time.sleep(30)  # in a child process: killed at the timeout
    return "woke up"


def hold(task):
    return timed(task, float(os.environ.get("PY_HOLD_SECONDS", "30")))


HANDLERS = {
    "py_limited": limited,
    "py_split": split,
    "py_item": item,
    "py_total": total,
    "py_parent": parent,
    "py_child": child,
    "py_parent_bad": parent_bad,
    "py_bad": bad,
    "py_echo": echo,
    "py_sleepy": sleepy,
    "py_stubborn": stubborn,
    "py_hold": hold,
}
PROCESS_HANDLERS = {"py_sleepy_proc": sleepy_proc}


def main():
    setup_logging()
    worker = Worker()
    for kind in os.environ["SLUICE_TEST_KINDS"].split(","):
        if kind in PROCESS_HANDLERS:
            worker.register(kind, PROCESS_HANDLERS[kind], process=True)
        else:
            worker.register(kind, HANDLERS[kind])
    worker.run()


if __name__ == "__main__":
    main()
