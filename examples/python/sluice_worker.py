"""A sluice worker library for Python, standard library only.

It speaks sluice's HTTP worker protocol (protocol/doc.go, openapi.yaml):
it registers, long-polls for tasks, runs each handler on a slot of its
own, heartbeats with the tasks it holds, reports results, lets handlers
trigger child tasks and wait for them, and hands its tasks back when it
is stopped. Copy this file next to your program, or put its folder on
PYTHONPATH.

    from sluice_worker import Worker

    worker = Worker()                  # SLUICE_SERVER, SLUICE_TOKEN, …

    @worker.handler("greet")
    def greet(task):                   # task.input: the task's JSON input
        return {"hello": task.input["name"]}

    worker.run()                       # until SIGTERM or Ctrl-C

What a handler gets and may do (Task):

  * task.id, kind, queue, concurrency_key, attempt, max_attempts, input,
    timeout (seconds, 0 for none), run_id, step, item;
  * task.sleep(s) and task.check() raise Cancelled once the attempt must
    stop (its timeout, a cancellation, a lost lease, the shutdown), and
    task.cancelled says so: a handler in a thread cannot be stopped from
    outside, so a long one should call them;
  * task.run_child(kind, input, **fields) triggers a child task and waits
    for it, and returns its output; task.run_child_workflow(name, input)
    does the same with a run of a workflow; trigger_child and wait_child
    are the two halves. A child that failed for good raises ChildFailed,
    which fails the parent for good too (its later attempts would get the
    same failed child back). While a handler waits, its slot here is lent
    to the claims, so a worker with one slot can run the child itself.

A handler returns its output (any JSON value) or raises: NoRetry(msg)
fails the task without further attempts, Retry(msg, after=s) asks for the
next attempt after s seconds, any other exception fails the attempt (it
is retried while attempts remain).

Timeouts. A claimed task carries its `timeout`. The worker enforces it,
as the Go SDK does: at the timeout it cancels the handler (task.cancelled
turns true, task.sleep raises) and reports "timeout: attempt exceeded 1s"
(retried while attempts remain). A handler registered with process=True
runs in a child process, which is killed at the timeout, so even code
that never looks at task.cancelled stops; a thread handler that ignores
the cancellation for a second is abandoned: the timeout is reported, and
its thread keeps one of the worker's slots until it returns.

Shutdown. SIGTERM or SIGINT stops claiming, lets running handlers finish
for up to shutdown_timeout, then cancels the rest and releases them: the
server hands them out again, the attempt not counted. A second signal
exits at once.

Errors. Every call the worker repeats (register, claim, heartbeat,
complete, release, the child calls) is retried after a network error or a
502, 503 or 504, with jittered exponential backoff (0.1 s to 5 s) and
never sooner than the answer's Retry-After; a claim answered 429 waits
its Retry-After the same way. A child trigger answered 429 (the server's
admission ceiling) raises AdmissionError in the handler, as in the Go SDK:
unless the handler catches it, the attempt fails and is retried after the
Retry-After.
"""

import http.client
import json
import logging
import multiprocessing
import multiprocessing.connection
import os
import random
import re
import signal
import socket
import sys
import threading
import time
import urllib.parse
from email.utils import parsedate_to_datetime

__all__ = [
    "APIError",
    "AdmissionError",
    "Cancelled",
    "Child",
    "ChildFailed",
    "NoRetry",
    "Retry",
    "Task",
    "Worker",
    "format_duration",
    "parse_duration",
]

log = logging.getLogger("sluice_worker")

# How long the worker waits for handlers it cancelled before it gives up
# on them (the Go SDK's hardStopGrace).
CANCEL_GRACE = 1.0
# How much sooner than the task's own timeout the server may tell the
# worker to stop it: the server counts from the claim's commit, a little
# before the handler starts (the Go SDK's serverTimeoutSkew).
SERVER_TIMEOUT_SKEW = 0.25
# Added to a long-poll's wait for the HTTP call's own timeout.
POLL_SLACK = 15.0
# Bounds releasing, reporting and leaving once the shutdown deadline
# passed (the Go SDK's cleanupTimeout).
CLEANUP_TIMEOUT = 10.0
BACKOFF_MIN, BACKOFF_MAX = 0.1, 5.0


# --- Durations: Go's syntax on the wire ("1.5s", "250ms", "1h2m").

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text):
    """Reads a Go duration string ("1.5s", "250ms", "1h2m", "0s") as seconds."""
    if text in (None, "", "0"):
        return 0.0
    sign = -1.0 if text.startswith("-") else 1.0
    rest = text.lstrip("+-")
    total, pos = 0.0, 0
    for m in _PART.finditer(rest):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    if pos != len(rest) or pos == 0:
        raise ValueError(f"not a duration: {text!r}")
    return sign * total


def format_duration(seconds):
    """Writes seconds as a Go duration string (to the millisecond)."""
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _duration_env(name, default):
    v = os.environ.get(name)
    return parse_duration(v) if v else default


# --- Errors.


class APIError(Exception):
    """A non-2xx answer: the status, the error's code, message and field,
    and its Retry-After in seconds (0 when none)."""

    def __init__(self, status, code, message, field="", retry_after=0.0):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.field, self.retry_after = field, retry_after

    def __str__(self):
        return f"{self.message} (HTTP {self.status} {self.code})"


class AdmissionError(APIError):
    """A 429: the server's admission ceiling refused a trigger."""


class NoRetry(Exception):
    """Raised by a handler: fail the task without further attempts."""


class Retry(Exception):
    """Raised by a handler: fail the attempt, and retry after `after`
    seconds instead of the server's backoff."""

    def __init__(self, message, after):
        super().__init__(message)
        self.after = after


class ChildFailed(NoRetry):
    """A child that failed or was cancelled: it ended for good, and a
    later attempt of the parent would get it back, so a handler that lets
    this propagate fails its task for good."""

    def __init__(self, child, state, message):
        self.child, self.state, self.message = child, state, message
        what = "run" if child.is_run else "task"
        text = f"child {what} {child.id} {state}"
        super().__init__(f"{text}: {message}" if message else text)


class Cancelled(Exception):
    """Raised by Task.sleep and Task.check once the attempt must stop.
    reason is "timeout", "cancelled" (asked through the API), "lost" (the
    lease) or "shutdown"."""

    def __init__(self, reason):
        super().__init__(f"attempt stopped: {reason}")
        self.reason = reason


def _error_of(exc):
    """The failed result's fields for a handler's exception."""
    if isinstance(exc, (NoRetry, Retry, APIError, Cancelled)):
        msg = str(exc)
    else:
        msg = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    result = {"error": msg or type(exc).__name__}
    if isinstance(exc, NoRetry):
        result["no_retry"] = True
    if isinstance(exc, Retry) and exc.after > 0:
        result["retry_after"] = format_duration(exc.after)
    elif isinstance(exc, AdmissionError) and exc.retry_after > 0:
        result["retry_after"] = format_duration(exc.retry_after)
    return result


def _transient(exc, admission):
    """Whether repeating the call may succeed."""
    if isinstance(exc, AdmissionError):
        return admission
    if isinstance(exc, APIError):
        return exc.status in (502, 503, 504)
    return isinstance(exc, (OSError, http.client.HTTPException))


def _retry_wait(exc, backoff):
    """Backoff, jittered (half to all of it), never less than the answer's
    Retry-After, plus up to a quarter more so that workers told the same do
    not come back together (the Go SDK's retryWait)."""
    d = backoff / 2 + random.uniform(0, backoff / 2)
    least = exc.retry_after if isinstance(exc, APIError) else 0.0
    if d < least:
        d = least + random.uniform(0, least / 4)
    return d


# --- HTTP.


class _Abort:
    """Lets another thread cut a call in flight short (a long-poll at
    shutdown, a child wait whose task was cancelled)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._sock = None
        self.aborted = False

    def attach(self, sock):
        with self._lock:
            self._sock = sock
            if self.aborted:
                self._shut()

    def detach(self):
        with self._lock:
            self._sock = None

    def abort(self):
        with self._lock:
            self.aborted = True
            self._shut()

    def _shut(self):
        if self._sock is not None:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class Client:
    """Sends the worker protocol's calls: JSON in, JSON out, a bearer token."""

    def __init__(self, server, token=""):
        u = urllib.parse.urlsplit(server.split(",")[0].strip())
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"server: want http://HOST:PORT or https://…, got {server!r}")
        self._https = u.scheme == "https"
        self._host, self._port = u.hostname, u.port
        self._base = u.path.rstrip("/")
        self._token = token

    def request(self, method, path, body=None, timeout=30.0, abort=None):
        """Sends one request; returns (status, decoded answer or None)."""
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        conn = cls(self._host, self._port, timeout=timeout)
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = "Bearer " + self._token
        try:
            conn.connect()
            if abort is not None:
                abort.attach(conn.sock)
            conn.request(method, self._base + path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
            status, retry_after = resp.status, resp.getheader("Retry-After", "")
        finally:
            if abort is not None:
                abort.detach()
            conn.close()
        if status >= 400:
            raise _api_error(status, raw, retry_after)
        try:
            return status, (json.loads(raw) if raw else None)
        except ValueError as e:
            raise APIError(status, "bad_answer", f"the answer is not JSON: {e}") from None

    def call(self, method, path, body=None, *, timeout=30.0, abort=None, stop=None, admission=True, give_up=None):
        """request, repeated while the error is transient (see the module
        documentation, "Errors") until it succeeds, stop() turns true,
        abort is aborted, or give_up (a time.monotonic() value) passes."""
        backoff = BACKOFF_MIN
        while True:
            try:
                return self.request(method, path, body, timeout, abort)
            except (APIError, OSError, http.client.HTTPException) as e:
                if not _transient(e, admission) or (abort is not None and abort.aborted):
                    raise
                d = _retry_wait(e, backoff)
                if give_up is not None and time.monotonic() + d > give_up:
                    raise
                log.warning("%s %s failed, retrying in %.2fs: %s", method, path, d, e)
                if _sleep_unless(d, stop) or (abort is not None and abort.aborted):
                    raise
                backoff = min(2 * backoff, BACKOFF_MAX)


def _sleep_unless(seconds, stop):
    """Sleeps seconds, in short steps while stop() is false; returns
    whether stop() turned true."""
    until = time.monotonic() + seconds
    while True:
        if stop is not None and stop():
            return True
        left = until - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(left, 0.1) if stop is not None else left)


def _api_error(status, raw, retry_after):
    code, message, field = "", "", ""
    try:
        err = json.loads(raw).get("error") or {}
        code, message, field = err.get("code", ""), err.get("message", ""), err.get("field", "")
    except (ValueError, AttributeError):
        message = raw.decode(errors="replace").strip()[:200]
    seconds = 0.0
    if retry_after.strip().isdigit():
        seconds = float(retry_after.strip())
    elif retry_after:
        try:
            seconds = max(0.0, parsedate_to_datetime(retry_after).timestamp() - time.time())
        except (TypeError, ValueError):
            pass
    cls = AdmissionError if status == 429 else APIError
    return cls(status, code or f"http_{status}", message or f"HTTP {status}", field, seconds)


# --- What a handler sees.


class Child:
    """A child a handler triggered: its id (a task's, or a run's when
    is_run), its call position, whether this call created it (false when an
    earlier attempt of the parent did), and the task or run as answered."""

    def __init__(self, answer, created):
        self.task, self.run = answer.get("task"), answer.get("run")
        self.is_run = self.task is None
        self.id = (self.run if self.is_run else self.task)["id"]
        self.call, self.created = answer.get("call", 0), created

    def __repr__(self):
        return f"Child({'run' if self.is_run else 'task'} {self.id}, call {self.call})"


class Task:
    """One claimed attempt, as its handler sees it."""

    def __init__(self, claimed, worker=None):
        self.id = claimed["id"]
        self.kind = claimed["kind"]
        self.queue = claimed.get("queue", "")
        self.concurrency_key = claimed.get("concurrency_key", "")
        self.attempt = claimed["attempt"]
        self.max_attempts = claimed.get("max_attempts", 0)
        self.input = claimed.get("input")
        self.timeout_text = claimed.get("timeout") or "0s"
        self.timeout = parse_duration(self.timeout_text)
        self.run_id = claimed.get("run_id", 0)
        self.step = claimed.get("step", "")
        self.item = claimed.get("item")
        self.started = time.monotonic()
        self.cancel_reason = None
        self._worker = worker
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._calls = 0  # child call positions used by this attempt
        self._abort = _Abort()  # the child call in flight

    @property
    def cancelled(self):
        """True once the attempt must stop (see Cancelled)."""
        return self._cancel.is_set()

    def check(self):
        """Raises Cancelled if the attempt must stop."""
        if self._cancel.is_set():
            raise Cancelled(self.cancel_reason)

    def sleep(self, seconds):
        """Sleeps, or raises Cancelled as soon as the attempt must stop."""
        if self._cancel.wait(seconds):
            raise Cancelled(self.cancel_reason)

    def _stop(self, reason):
        with self._lock:
            if self.cancel_reason is None:
                self.cancel_reason = reason
        self._cancel.set()
        self._abort.abort()

    # Children (docs/workflows.md, "Child tasks and waits").

    def trigger_child(self, kind=None, input=None, *, workflow=None, call=None, **fields):
        """Triggers a child task of kind (or a run of workflow) and returns
        a Child. fields are the trigger's other fields (queue,
        concurrency_key, priority, max_attempts, timeout, version, …);
        timeout and dispatch_deadline may be seconds. The same call
        position in a later attempt returns the child the first made."""
        w = self._need_worker()
        body = {k: (format_duration(v) if k in ("timeout", "dispatch_deadline") and isinstance(v, (int, float)) else v)
                for k, v in fields.items()}
        if workflow is not None:
            body["workflow"] = workflow
        else:
            body["kind"] = kind
        if input is not None:
            body["input"] = input
        with self._lock:
            if call is None:
                # Counted here, not by the server: a call repeated after
                # a lost answer keeps its position, so it finds the
                # child the lost answer was about.
                self._calls += 1
                call = self._calls
            body["call"] = call
        status, answer = self._child_call("/children", body, 30.0)
        with self._lock:
            self._calls = max(self._calls, answer.get("call", 0))
        return Child(answer, created=status == 201)

    def wait_child(self, child, poll=30.0):
        """Waits for child to end and returns its output; raises
        ChildFailed if it failed or was cancelled, APIError with code
        RECURSIVE_WAIT_DEADLOCK if the server cannot grant the wait, and
        Cancelled if the attempt must stop meanwhile."""
        w = self._need_worker()
        body = {"run_id": child.id} if child.is_run else {"task_id": child.id}
        lent, wait = False, 0.0
        try:
            while True:
                # The first call answers at once: it suspends the task on
                # the server, and the slot is lent before any long-poll.
                _, res = self._child_call("/wait", body, wait + POLL_SLACK)
                if res.get("done"):
                    break
                if not lent:
                    w._slots.lend()
                    lent = True
                    w._lent()
                wait = poll
                body["wait"] = format_duration(poll)
        finally:
            if lent:
                w._slots.take_back(self)
        self.check()
        ended = res.get("run") if child.is_run else res.get("task")
        ended = ended or {}
        if res.get("child_failed") or ended.get("state") != "succeeded":
            raise ChildFailed(child, ended.get("state", "failed"), ended.get("error", ""))
        return ended.get("output")

    def run_child(self, kind, input=None, **fields):
        """trigger_child then wait_child: the child task's output."""
        return self.wait_child(self.trigger_child(kind, input, **fields))

    def run_child_workflow(self, workflow, input=None, **fields):
        """A child run of workflow (its latest version unless version=):
        the run's output."""
        return self.wait_child(self.trigger_child(None, input, workflow=workflow, **fields))

    def _need_worker(self):
        if self._worker is None:
            raise RuntimeError("child tasks need a thread handler (registered without process=True)")
        return self._worker

    def _child_call(self, suffix, body, timeout):
        w = self._worker
        self.check()
        try:
            return w.client.call("POST", f"/v1/workers/{w.id}/tasks/{self.id}{suffix}", body, timeout=timeout,
                                 abort=self._abort, stop=self._cancel.is_set, admission=False)
        except (OSError, http.client.HTTPException, APIError):
            self.check()  # cut short because the attempt must stop
            raise


# --- The worker's bookkeeping.


class _Slots:
    """The worker's slots: taken by running handlers (an abandoned one
    until its thread returns) and asked for by the claims in flight; a
    handler that waits for a child lends its slot and takes one back,
    ahead of the claims, when its wait ends."""

    def __init__(self, n):
        self.n = n
        self.used = 0  # running handlers
        self.reserved = 0  # asked for by the claims in flight
        self.reclaiming = 0  # handlers waiting to take their slot back
        self.cond = threading.Condition()

    def _free(self):
        return self.n - self.used - self.reserved - self.reclaiming

    def reserve(self, stop):
        """Waits for free slots and reserves them; returns how many a claim
        may ask for (0 once stop() is true)."""
        with self.cond:
            while not stop() and self._free() <= 0:
                self.cond.wait(0.1)
            return 0 if stop() else self.reserve_now()

    def reserve_now(self):
        """Reserves the free slots, if any, at once; returns how many."""
        with self.cond:
            k = max(0, self._free())
            self.reserved += k
            return k

    def claimed(self, asked, started):
        """A claim that asked for `asked` slots got `started` tasks."""
        with self.cond:
            self.reserved = max(0, self.reserved - asked)
            self.used += started
            self.cond.notify_all()

    def free(self):
        with self.cond:
            self.used -= 1
            self.cond.notify_all()

    lend = free

    def take_back(self, task):
        # A slot a claim in flight asked for is taken all the same: that
        # claim is most likely the long-poll, and the server, which counts
        # the task running again, hands it no task for the slot. When the
        # attempt must stop it takes one anyway, for a moment: the handler
        # is about to return and free it.
        with self.cond:
            self.reclaiming += 1
            while self.used + self.reserved >= self.n and self.reserved == 0 and not task.cancelled:
                self.cond.wait(0.05)
            self.reclaiming -= 1
            if self.used + self.reserved >= self.n and self.reserved > 0:
                self.reserved -= 1
            self.used += 1
            self.cond.notify_all()

    def free_count(self):
        with self.cond:
            return max(0, self.n - self.used)


class _ClaimSeqs:
    """Numbers the claim calls and knows which are in flight, so that each
    heartbeat can say which answers are in (claims_settled,
    claims_pending): a task a settled claim handed out that the heartbeat
    does not list was lost with its answer, and the server releases it,
    the attempt not counted."""

    def __init__(self):
        self._lock = threading.Lock()
        self.last = 0
        self._inflight = set()

    def begin(self):
        with self._lock:
            self.last += 1
            self._inflight.add(self.last)
            return self.last

    def end(self, seq):
        with self._lock:
            self._inflight.discard(seq)

    def settled(self):
        with self._lock:
            return self.last, sorted(self._inflight)


class _Run:
    """A held task: its handler's state and its outcome."""

    def __init__(self, task, process):
        self.task = task
        self.process = process
        self.state = "running"  # then "reporting", "releasing" or "dropped"
        self.wake = threading.Event()  # the handler returned, or the task must stop
        self.outcome = None  # ("ok", output) or ("error", result fields)
        self.handler_done = False
        self.abandoned = False


def _process_main(fn, claimed, conn):
    """Runs a process=True handler in the child process; sends its outcome."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the worker stops us
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        conn.send(("ok", fn(Task(claimed))))
    except BaseException as e:  # noqa: BLE001 - any failure is the task's
        conn.send(("error", _error_of(e)))
    finally:
        conn.close()


class Worker:
    """A sluice worker. Arguments left out come from the environment, with
    the names `sluice worker` uses: SLUICE_SERVER (default
    http://127.0.0.1:8080), SLUICE_TOKEN or else SLUICE_WORKER_TOKEN,
    SLUICE_NAME (default HOST-PID), SLUICE_SLOTS (default 10),
    SLUICE_POLL_WAIT (default 30s), SLUICE_SHUTDOWN_TIMEOUT (default 30s).
    Register handlers, then call run()."""

    def __init__(self, server=None, token=None, *, name=None, slots=None, poll_wait=None, shutdown_timeout=None):
        server = server or os.environ.get("SLUICE_SERVER") or "http://127.0.0.1:8080"
        if token is None:
            token = os.environ.get("SLUICE_TOKEN") or os.environ.get("SLUICE_WORKER_TOKEN", "")
        self.client = Client(server, token)
        self.name = name or os.environ.get("SLUICE_NAME") or f"{socket.gethostname()}-{os.getpid()}"
        self.slots = slots or int(os.environ.get("SLUICE_SLOTS", "10"))
        self.poll_wait = poll_wait if poll_wait is not None else _duration_env("SLUICE_POLL_WAIT", 30.0)
        self.shutdown_timeout = (shutdown_timeout if shutdown_timeout is not None
                                 else _duration_env("SLUICE_SHUTDOWN_TIMEOUT", 30.0))
        if self.slots < 1:
            raise ValueError(f"slots: must be ≥ 1, got {self.slots}")
        if not 0 < self.poll_wait <= 60:
            raise ValueError(f"poll_wait: must be > 0 and at most 60s, got {self.poll_wait}")
        self.id = None
        self._handlers = {}  # kind → (function, process)
        self._lock = threading.Lock()
        self._held = {}  # task id → _Run: every task the server counts as ours
        self._slots = _Slots(self.slots)
        self._seqs = _ClaimSeqs()
        self._stopping = threading.Event()  # no more claims or starts
        self._hb_stop = threading.Event()
        self._claim_abort = _Abort()  # the claim in flight's
        self._polling = False  # a long-poll claim is in flight
        self._extended = 0.0  # monotonic send time of the latest call that extended the lease
        self._signals = 0
        self._mp = None

    # Registering handlers.

    def register(self, kind, fn, *, process=False):
        """Sets the handler of kind: fn(task) returns the output. With
        process=True each attempt runs in a child process (fn must be a
        module-level function), which is killed at the timeout."""
        if not kind or kind in self._handlers:
            raise ValueError(f"kind {kind!r}: empty or registered twice")
        self._handlers[kind] = (fn, process)

    def handler(self, kind, *, process=False):
        """Decorator form of register."""

        def deco(fn):
            self.register(kind, fn, process=process)
            return fn

        return deco

    # Running.

    def run(self):
        """Registers, then claims and runs tasks until stop() is called or,
        when called from the main thread, SIGTERM or SIGINT arrives; then
        shuts down (see the module documentation, "Shutdown")."""
        if not self._handlers:
            raise RuntimeError("no handlers registered")
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        if not self._register():
            return
        hb = threading.Thread(target=self._heartbeat_loop, name="sluice-heartbeat", daemon=True)
        claims = threading.Thread(target=self._claim_loop, name="sluice-claims", daemon=True)
        hb.start()
        claims.start()
        # The main thread only waits: signal handlers run here, and only
        # set a flag (stop() then does the work).
        while not self._stopped():
            time.sleep(0.1)
        self._shutdown(claims, hb)

    def stop(self):
        """Asks run() to shut down (from any thread)."""
        self._stopping.set()

    def _stopped(self):
        return self._signals > 0 or self._stopping.is_set()

    def _on_signal(self, signum, frame):
        # Only a counter: the handler may interrupt a thread holding any
        # lock, so it takes none.
        self._signals += 1
        if self._signals > 1:
            os._exit(130)  # a second signal: leave now

    def _register(self):
        body = {"name": self.name, "kinds": sorted(self._handlers), "slots": self.slots}
        sent = time.monotonic()
        try:
            _, reg = self.client.call("POST", "/v1/workers", body, stop=self._stopped)
        except (APIError, OSError, http.client.HTTPException):
            if self._stopped():
                return False
            raise
        self.id = reg["id"]
        self._lease = parse_duration(reg.get("lease") or "30s")
        self._interval = parse_duration(reg.get("heartbeat_interval") or "0s") or self._lease / 3
        # Past this since the latest call that extended the lease was
        # sent, the server may have taken the tasks back: stop them.
        self._loss_after = self._lease - self._interval / 2
        self._extended = sent
        log.info("registered as worker %s (%s, kinds %s, %d slots)", self.id, self.name, body["kinds"], self.slots)
        return True

    def _lease_held(self):
        return time.monotonic() - self._extended < self._loss_after

    def _forgotten(self, worker_id):
        """The server answered 404 for worker_id: its lease expired and it
        swept our tasks. Drop them and register again."""
        with self._lock:
            if self.id != worker_id:
                return  # another thread did it already
            runs = list(self._held.values())
            self._held.clear()
            log.warning("the server forgot worker %s; dropping %d tasks and registering again", worker_id, len(runs))
            for run in runs:
                run.task._stop("lost")
                run.wake.set()
            try:
                self._register()
            except (APIError, OSError, http.client.HTTPException) as e:
                log.error("registering again failed: %s; stopping", e)
                self._stopping.set()
        self._claim_abort.abort()  # a long-poll of the forgotten registration

    def _claim_loop(self):
        backoff = BACKOFF_MIN
        while not self._stopped():
            n = self._slots.reserve(self._stopped)
            if n == 0:
                break
            # A new abort per call, checked after it is in place: the
            # shutdown, or a new registration, cuts the long-poll short.
            abort = self._claim_abort = _Abort()
            if self._stopped():
                self._slots.claimed(n, 0)
                break
            wid = self.id
            self._polling = True
            try:
                self._claim(wid, n, self.poll_wait, abort)
            except (APIError, OSError, http.client.HTTPException) as e:
                if self._stopped():
                    break
                if isinstance(e, APIError) and e.status == 404:
                    self._forgotten(wid)
                    continue
                if wid != self.id:
                    continue  # registered again meanwhile
                d = _retry_wait(e, backoff)
                log.warning("claiming failed, retrying in %.2fs: %s", d, e)
                _sleep_unless(d, self._stopped)
                backoff = min(2 * backoff, BACKOFF_MAX)
                continue
            finally:
                self._polling = False
            backoff = BACKOFF_MIN

    def _claim(self, wid, n, wait, abort=None):
        """One claim call for up to n tasks (n slots reserved), numbered
        for the heartbeats; starts what it brings."""
        seq, sent = self._seqs.begin(), time.monotonic()
        try:
            _, res = self.client.request("POST", f"/v1/workers/{wid}/claim",
                                         {"max": n, "wait": format_duration(wait), "seq": seq},
                                         timeout=wait + POLL_SLACK, abort=abort)
        except BaseException:
            self._slots.claimed(n, 0)
            self._seqs.end(seq)  # any tasks it claimed are lost with its answer
            raise
        tasks = res.get("tasks") or []
        if tasks:
            self._extended = max(self._extended, sent)
        for tid in res.get("cancel") or []:
            self._stop_task(tid, "cancelled")
        self._start(wid, tasks, n)
        self._seqs.end(seq)  # its tasks are held now

    def _lent(self):
        """A handler lent its slot for a child wait. A long-poll in flight
        may have asked while the server counted this worker full (the
        handler had taken its slot back from it): the server does not
        look at it again for a slot freed this way, so a claim that does
        not wait asks for the free slots now, the child perhaps among the
        tasks it finds."""
        if not self._polling or self._stopped():
            return
        n = self._slots.reserve_now()
        if n == 0:
            return
        try:
            self._claim(self.id, n, 0)
        except (APIError, OSError, http.client.HTTPException) as e:
            log.info("claiming for a lent slot failed (the long-poll claims it later): %s", e)

    def _start(self, wid, tasks, asked):
        """Holds and starts claimed tasks, or releases them: those beyond
        what was asked, reserved successors (this worker does not take
        handovers), and all when stopping or the lease may have expired."""
        release, runs = [], []
        with self._lock:
            ok = wid == self.id and not self._stopped() and self._lease_held()
            for t in tasks:
                if not ok or t.get("after") or len(runs) >= asked:
                    release.append(t["id"])
                    continue
                fn, process = self._handlers.get(t["kind"], (None, False))
                run = _Run(Task(t, self), process)
                self._held[t["id"]] = run
                runs.append((run, fn))
        self._slots.claimed(asked, len(runs))
        for run, fn in runs:
            threading.Thread(target=self._supervise, args=(run, fn), name=f"sluice-task-{run.task.id}", daemon=True).start()
        if release:
            self._release(wid, release)

    def _stop_task(self, tid, reason):
        with self._lock:
            run = self._held.get(tid)
        if run is not None and run.state == "running":
            run.task._stop(reason)
            run.wake.set()

    # Running one attempt.

    def _supervise(self, run, fn):
        """Runs one attempt's handler, enforces its timeout, and reports
        its result."""
        task = run.task
        try:
            if fn is None:
                run.outcome = ("error", {"error": f"no handler for kind {task.kind!r} on this worker", "no_retry": True})
                run.handler_done = True
            elif run.process:
                self._run_process(run, fn)
            else:
                self._run_thread(run, fn)
            self._finish(run)
        except Exception:  # noqa: BLE001 - a bug here must not kill the worker silently
            log.exception("task %s: supervising the attempt failed", task.id)
            self._forget(run)
        finally:
            with self._lock:
                free = not run.abandoned
            if free:
                self._slots.free()

    def _wait_handler(self, run, done, wait, on_stop=None):
        """Waits, wait(seconds) at a time, until done() or the attempt must
        stop: at its timeout, or the lease's end, it is stopped here; once
        stopped, on_stop kills a process at once, and a thread gets
        CANCEL_GRACE to return."""
        task = run.task
        deadline = task.started + task.timeout if task.timeout > 0 else None
        grace_until = None
        while not done():
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                task._stop("timeout")
            if not self._lease_held():
                task._stop("lost")
            if task.cancelled:
                if on_stop is not None:
                    on_stop()
                    return
                if grace_until is None:
                    grace_until = now + CANCEL_GRACE
                elif now >= grace_until:
                    return
            nxt = 0.25
            if deadline is not None and not task.cancelled:
                nxt = min(nxt, max(0.0, deadline - now))
            if grace_until is not None:
                nxt = min(nxt, max(0.0, grace_until - now))
            wait(nxt)

    def _run_thread(self, run, fn):
        def call():
            try:
                run.outcome = ("ok", fn(run.task))
            except BaseException as e:  # noqa: BLE001 - any failure is the task's
                run.outcome = ("error", _error_of(e))
            with self._lock:
                run.handler_done = True
                abandoned = run.abandoned
            if abandoned:
                log.warning("task %s: an abandoned handler returned; its slot is free", run.task.id)
                self._slots.free()
            run.wake.set()

        def wait(seconds):
            run.wake.wait(seconds)
            run.wake.clear()

        threading.Thread(target=call, name=f"sluice-handler-{run.task.id}", daemon=True).start()
        self._wait_handler(run, lambda: run.handler_done, wait)
        with self._lock:
            if not run.handler_done:
                run.abandoned = True  # its thread frees the slot when it returns
        if run.abandoned:
            log.warning("task %s: handler ignored its cancellation (%s) for %.0fs; abandoning it "
                        "(it keeps a slot until it returns; register it with process=True to have it killed)",
                        run.task.id, run.task.cancel_reason, CANCEL_GRACE)

    def _run_process(self, run, fn):
        if self._mp is None:
            methods = multiprocessing.get_all_start_methods()
            self._mp = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        task = run.task
        claimed = {"id": task.id, "kind": task.kind, "queue": task.queue, "concurrency_key": task.concurrency_key,
                   "attempt": task.attempt, "max_attempts": task.max_attempts, "input": task.input,
                   "timeout": task.timeout_text, "run_id": task.run_id, "step": task.step, "item": task.item}
        parent, child = self._mp.Pipe(duplex=False)
        proc = self._mp.Process(target=_process_main, args=(fn, claimed, child), daemon=True)
        proc.start()
        child.close()

        def done():
            if run.outcome is None and parent.poll(0):
                try:
                    run.outcome = parent.recv()
                except EOFError:
                    pass
            if run.outcome is None and not proc.is_alive() and not parent.poll(0):
                run.outcome = ("error", {"error": f"handler process exited with code {proc.exitcode}"})
            return run.outcome is not None

        def wait(seconds):
            # The answer, the process's end, or (every 50ms) a stop.
            multiprocessing.connection.wait([parent, proc.sentinel], min(seconds, 0.05))

        try:
            self._wait_handler(run, done, wait, on_stop=proc.kill)
        finally:
            if proc.is_alive():
                proc.kill()
            proc.join()
            parent.close()
        run.handler_done = True

    def _finish(self, run):
        """Reports the attempt's result, or leaves it to the shutdown, or
        drops it."""
        task = run.task
        reason = task.cancel_reason
        with self._lock:
            if self._held.get(task.id) is not run:
                return  # dropped already (the server forgot this worker)
            if reason == "shutdown":
                run.state = "releasing"  # the shutdown hands it back
                return
            if reason == "lost":
                run.state = "dropped"
                del self._held[task.id]
                log.warning("task %s: lost its lease; dropped its result", task.id)
                return
            run.state = "reporting"
        took = time.monotonic() - task.started
        result = {"task_id": task.id, "attempt": task.attempt}
        timed_out = {"error": f"timeout: attempt exceeded {task.timeout_text}"}
        if reason == "timeout":
            result.update(timed_out)
        elif reason == "cancelled":
            # A cancellation asked through the API ends the task; the
            # server also cancels a task past its timeout, which is
            # retried, so then no no_retry (as the Go SDK does).
            if task.timeout > 0:
                result.update(timed_out if took >= task.timeout - SERVER_TIMEOUT_SKEW else {"error": "cancelled"})
            else:
                result.update(error="cancelled", no_retry=True)
        elif run.outcome is None:
            result.update(error="handler did not return")
        elif run.outcome[0] == "ok":
            try:
                if run.outcome[1] is not None:
                    result["output"] = json.loads(json.dumps(run.outcome[1], allow_nan=False))
            except (TypeError, ValueError) as e:
                result.update(error=f"handler returned an output that is not JSON: {e}", no_retry=True)
        else:
            result.update(run.outcome[1])
        self._report(run, result)

    def _report(self, run, result):
        wid = self.id
        give_up = time.monotonic() + self._loss_after
        try:
            try:
                _, res = self.client.call("POST", f"/v1/workers/{wid}/complete", {"results": [result]}, give_up=give_up)
            except APIError as e:
                if not 400 <= e.status < 500 or e.status in (404, 429):
                    raise
                # The server refused the result itself (an output over
                # its size limit, say). Sending nothing would have the
                # task run again, to the same end: fail it for good.
                log.error("task %s: the server refused its result (%s); failing the task", result["task_id"], e)
                result = {"task_id": result["task_id"], "attempt": result["attempt"],
                          "error": f"the server refused the attempt's result: {e}", "no_retry": True}
                _, res = self.client.call("POST", f"/v1/workers/{wid}/complete", {"results": [result]}, give_up=give_up)
            ack = res["results"][0]
            if ack.get("status") != "ok":
                log.warning("task %s: result not taken (%s)", result["task_id"], ack.get("status"))
        except (APIError, OSError, http.client.HTTPException) as e:
            # The lease recovers the task (a new attempt), or the server
            # forgot this worker and recovered it already.
            log.error("task %s: reporting its result failed: %s", result["task_id"], e)
            if isinstance(e, APIError) and e.status == 404:
                self._forgotten(wid)
        finally:
            self._forget(run)

    def _forget(self, run):
        with self._lock:
            if self._held.get(run.task.id) is run:
                del self._held[run.task.id]

    def _release(self, wid, ids):
        try:
            self.client.call("POST", f"/v1/workers/{wid}/release", {"task_ids": ids},
                             give_up=time.monotonic() + CLEANUP_TIMEOUT)
        except (APIError, OSError, http.client.HTTPException) as e:
            # The server takes them back when the lease expires (an
            # attempt counted).
            log.error("releasing tasks %s failed: %s", ids, e)

    # Heartbeats.

    def _heartbeat(self):
        # Every claim numbered up to settled, but those pending, has been
        # answered (its tasks are held) or has failed: read before held.
        settled, pending = self._seqs.settled()
        with self._lock:
            wid = self.id
            snapshot = dict(self._held)
        body = {"held": sorted(snapshot), "free_slots": self._slots.free_count(), "slots": self.slots}
        if settled:
            body["claims_settled"] = settled
            if pending:
                body["claims_pending"] = pending
        sent = time.monotonic()
        try:
            _, res = self.client.request("POST", f"/v1/workers/{wid}/heartbeat", body, timeout=self._interval)
        except APIError as e:
            if e.status == 404:
                self._forgotten(wid)
            else:
                log.warning("heartbeat failed: %s", e)
            return
        except (OSError, http.client.HTTPException) as e:
            log.warning("heartbeat failed: %s", e)
            return
        self._extended = max(self._extended, sent)
        # Only the runs the snapshot named: most lost ids are tasks whose
        # results were taken since, and forgotten here already.
        for tid in res.get("lost") or []:
            run = snapshot.get(tid)
            if run is not None and run.state == "running":
                with self._lock:
                    same = self._held.get(tid) is run
                if same:
                    run.task._stop("lost")
                    run.wake.set()
        for tid in res.get("cancel") or []:
            self._stop_task(tid, "cancelled")

    def _heartbeat_loop(self):
        while not self._hb_stop.wait(self._interval):
            self._heartbeat()

    # Shutdown.

    def _shutdown(self, claims, hb):
        """Stops claiming, lets handlers finish up to shutdown_timeout, then
        stops and releases the rest, reports, says which claims are settled
        and leaves."""
        start = time.monotonic()
        self._stopping.set()
        self._claim_abort.abort()
        claims.join(CLEANUP_TIMEOUT)
        with self._lock:
            running = len(self._held)
        log.info("stopping: %d tasks held, waiting up to %.1fs for them", running, self.shutdown_timeout)
        if not self._wait_supervisors(self.shutdown_timeout):
            with self._lock:
                runs = [r for r in self._held.values() if r.state == "running"]
            for run in runs:
                run.task._stop("shutdown")
                run.wake.set()
            self._wait_supervisors(CANCEL_GRACE + 0.5)
        with self._lock:
            release = [tid for tid, r in self._held.items() if r.state in ("running", "releasing")]
        if release:
            log.info("releasing %d unfinished tasks: %s", len(release), release)
            self._release(self.id, release)
            with self._lock:
                for tid in release:
                    self._held.pop(tid, None)
        self._wait_supervisors(CLEANUP_TIMEOUT)  # results being reported
        self._hb_stop.set()
        hb.join(CLEANUP_TIMEOUT)
        if self._seqs.last:
            # A claim cut short may have handed out tasks whose answer
            # never came: this heartbeat has the server release them.
            self._heartbeat()
        try:
            self.client.call("DELETE", f"/v1/workers/{self.id}", give_up=time.monotonic() + CLEANUP_TIMEOUT)
        except (APIError, OSError, http.client.HTTPException) as e:
            log.error("leaving: %s", e)
        log.info("worker %s stopped in %.1fs", self.id, time.monotonic() - start)

    def _wait_supervisors(self, seconds):
        """Waits up to seconds for every attempt's supervisor to end, or to
        leave its task to the shutdown; reports whether they all did."""
        until = time.monotonic() + seconds
        while True:
            with self._lock:
                busy = any(r.state in ("running", "reporting") for r in self._held.values())
            if not busy:
                return True
            if time.monotonic() >= until:
                return False
            time.sleep(0.05)


def setup_logging(level=None):
    """Logs to stderr at SLUICE_LOG_LEVEL (default info): for programs."""
    level = level or os.environ.get("SLUICE_LOG_LEVEL", "info")
    logging.basicConfig(stream=sys.stderr, level=getattr(logging, level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
