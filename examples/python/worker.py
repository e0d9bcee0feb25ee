#!/usr/bin/env python3
"""An example sluice worker in Python: standard library only, on the
worker library beside it (sluice_worker.py). README.md says how to run it.

    SLUICE_SERVER=http://127.0.0.1:8080 SLUICE_TOKEN=<worker token> \\
        python3 examples/python/worker.py

    sluice enqueue greet --input '{"name": "Ada"}' --wait
    sluice enqueue sum-squares --input '{"numbers": [1, 2, 3]}' --wait
    sluice enqueue slow --input '{"seconds": 5}' --timeout 2s --wait
"""

import time

from sluice_worker import NoRetry, Worker, setup_logging

worker = Worker()


@worker.handler("greet")
def greet(task):
    name = (task.input or {}).get("name")
    if not name:
        raise NoRetry("input.name is required")  # retrying cannot fix it
    return {"greeting": f"Hello, {name}!"}


@worker.handler("sum-squares")
def sum_squares(task):
    """Triggers a `square` child task per number, then waits for each. While
    it waits its slot is lent, so even a one-slot worker runs the children."""
    children = [task.trigger_child("square", n) for n in task.input["numbers"]]
    return sum(task.wait_child(c) for c in children)


@worker.handler("square")
def square(task):
    return task.input * task.input


def slow(task):
    # time.sleep ignores cancellation; in a child process (below) the
    # worker kills it at the task's timeout. A thread handler would call
    # task.sleep, which stops at the timeout.
    seconds = float((task.input or {}).get("seconds", 1))
    time.sleep(seconds)
    return {"slept": seconds}


# process=True: a module-level function, run in a child process per attempt.
worker.register("slow", slow, process=True)

if __name__ == "__main__":
    setup_logging()
    worker.run()
