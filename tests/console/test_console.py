#!/usr/bin/env python3
"""The web console in a real browser: headless chromium driven through
chromedriver by selenium, against a real `letterbox serve --console-listen`,
with the gRPC client generated from the proto to set up and to check what
the pages did.

Run it with tests/console/run.sh, which makes the virtualenv, builds the
server and generates the client first. By hand:

    tests/python/generate.sh target/python-client     # needs grpcio-tools
    python3 tests/console/test_console.py              # needs selenium

Environment (all optional):
    LETTERBOX_BIN                  the server binary (default target/debug/letterbox)
    LETTERBOX_PY_CLIENT            the generated client (default target/python-client)
    LETTERBOX_CONSOLE_SCREENSHOTS  where screenshots go (default
                                   target/console-screenshots); a failing
                                   scenario leaves one in its failures/
    CHROMIUM, CHROMEDRIVER         the browser and its driver (default: the
                                   `chromium` and `chromedriver` on PATH,
                                   Debian's packages chromium and
                                   chromium-driver)

The scenarios, each a function below, follow the page contract of the
console (element ids, `data-*` attributes, form field names): a) the
overview lists queues created over gRPC; b) a nacked message shows on the
dead-letter page with its source, reason, count and last error; c) it is
redriven from that page (preview, confirm, job progress) and is back in its
queue; d) purge needs the queue's name typed; e) the depth plot draws;
f) with principals, the console needs a login, a reader cannot purge, and
a POST without the CSRF field is refused. a-e build on one another and run
on one server, in order, up to the first that fails; f has a server of its
own and runs in any case. Every failure is reported, with a screenshot,
the page's URL and text, and the server's log; the exit code is non-zero.

Servers never outlive the script: they are killed in a `finally`, and on
Linux also by the kernel if the script dies. Waits are bounded
(WebDriverWait), never fixed sleeps.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from urllib.parse import urlparse

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SERVER_BIN = os.environ.get(
    "LETTERBOX_BIN", os.path.join(ROOT, "target", "debug", "letterbox")
)
CLIENT_DIR = os.environ.get(
    "LETTERBOX_PY_CLIENT", os.path.join(ROOT, "target", "python-client")
)
SHOTS = os.environ.get(
    "LETTERBOX_CONSOLE_SCREENSHOTS", os.path.join(ROOT, "target", "console-screenshots")
)
sys.path.insert(0, CLIENT_DIR)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import grpc  # noqa: E402
from letterbox_server import (  # noqa: E402
    STARTUP_TIMEOUT_S,
    CheckFailed,
    Server,
    check,
    check_eq,
)
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import (  # noqa: E402
    JavascriptException,
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

try:
    from letterbox.v1 import letterbox_pb2 as pb  # noqa: E402
    from letterbox.v1 import letterbox_pb2_grpc as pb_grpc  # noqa: E402
except ImportError as e:
    sys.exit(
        f"cannot import the generated client from {CLIENT_DIR} ({e}); "
        "run tests/python/generate.sh first"
    )

RPC_TIMEOUT_S = 15
WAIT_S = 10  # a page, an element, a swap
JOB_WAIT_S = 30  # a redrive job to finish
PLOT_WAIT_S = 10  # the depth plot to draw

ADMIN_TOKEN = "console-admin-token-3b9e51f0"
READER_TOKEN = "console-reader-token-a4c27d86"

NACK_REASON = "payment service said 503"


def step(text):
    print(f"-- {text}", flush=True)


# ---------------------------------------------------------------- the server


def start_server(tmp, name, extra_args=()):
    """A server with its gRPC and console listeners on 127.0.0.1:0; its
    `addr` is the gRPC address and `url` the console's base URL (ending in
    `/`)."""
    server = Server(
        SERVER_BIN,
        os.path.join(tmp, f"{name}-data"),
        os.path.join(tmp, f"{name}.log"),
        [
            "--console-listen", "127.0.0.1:0",
            # Samples every half second, so that the plots have a shape
            # within the test's few seconds of traffic.
            "--console-sample-interval", "500ms",
            *extra_args,
        ],
        console=True,
    )
    check(
        re.fullmatch(r"https?://[^/\s]+/", server.url) is not None,
        f"the console URL {server.url!r} is http(s)://HOST:PORT/",
    )
    print(f"server {name} (pid {server.proc.pid}): gRPC {server.addr}, console {server.url}",
          flush=True)
    return server


class Grpc:
    """The generated client, with a bearer token on every call if given."""

    def __init__(self, addr, token=None):
        self.channel = grpc.insecure_channel(addr)
        grpc.channel_ready_future(self.channel).result(timeout=STARTUP_TIMEOUT_S)
        self.admin = pb_grpc.AdminServiceStub(self.channel)
        self.msg = pb_grpc.MessagingServiceStub(self.channel)
        self.md = [("authorization", f"Bearer {token}")] if token else []

    def _call(self, method, request):
        return method(request, timeout=RPC_TIMEOUT_S, metadata=self.md)

    def create(self, name, dlq=None, max_deliveries=1):
        config = pb.QueueConfig()
        if dlq:
            config.dead_letter.CopyFrom(
                pb.DeadLetterPolicy(queue=dlq, max_deliveries=max_deliveries)
            )
        r = self._call(self.admin.CreateQueue, pb.CreateQueueRequest(name=name, config=config))
        check(r.created, f"queue {name} created over gRPC")

    def publish(self, q, *bodies, properties=None):
        r = self._call(
            self.msg.Publish,
            pb.PublishRequest(
                queue=q,
                messages=[pb.PublishMessage(body=b.encode(), properties=properties or {})
                          for b in bodies],
            ),
        )
        check_eq(len(r.results), len(bodies), f"publish results for {q}")
        return [x.message_id for x in r.results]

    def receive(self, q, n):
        r = self._call(
            self.msg.Receive, pb.ReceiveRequest(queue=q, max_messages=n, wait_ms=5000)
        )
        check_eq(len(r.deliveries), n, f"deliveries received from {q}")
        return list(r.deliveries)

    def ack(self, tokens):
        r = self._call(self.msg.Ack, pb.AckRequest(ack_tokens=tokens))
        check(all(x.status == pb.SETTLE_STATUS_OK for x in r.results), f"acks settled: {r}")

    def nack(self, token, reason):
        r = self._call(
            self.msg.Nack,
            pb.NackRequest(items=[pb.NackItem(ack_token=token, reason=reason)]),
        )
        check_eq(r.results[0].status, pb.SETTLE_STATUS_OK, "nack status")

    def stats(self, q):
        return self._call(self.admin.GetQueueStats, pb.GetQueueStatsRequest(name=q)).stats

    def browse(self, q):
        return list(self._call(self.admin.Browse, pb.BrowseRequest(queue=q)).messages)

    def close(self):
        self.channel.close()


# --------------------------------------------------------------- the browser


def new_browser():
    """Headless chromium through chromedriver, 1400x1000."""
    options = webdriver.ChromeOptions()
    options.binary_location = os.environ.get("CHROMIUM") or shutil.which("chromium")
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        "--disable-gpu",
        "--no-first-run",
        "--no-default-browser-check",
    ):
        options.add_argument(arg)
    service = Service(os.environ.get("CHROMEDRIVER") or shutil.which("chromedriver"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_window_size(1400, 1000)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(15)
    return driver


def wait_for(driver, what, cond, timeout=WAIT_S):
    """Polls `cond(driver)` until it is truthy (elements that are missing or
    replaced meanwhile count as not yet); fails naming `what`."""
    try:
        return WebDriverWait(
            driver,
            timeout,
            poll_frequency=0.1,
            ignored_exceptions=(NoSuchElementException, StaleElementReferenceException),
        ).until(cond)
    except TimeoutException:
        try:
            body = driver.find_elements(By.TAG_NAME, "main") or driver.find_elements(
                By.TAG_NAME, "body")
            says = " ".join(body[0].text.split())[:300] if body else ""
        except WebDriverException:
            says = ""
        raise CheckFailed(
            f"timed out after {timeout}s waiting for {what} (page {driver.current_url}, "
            f"which says: {says!r})"
        ) from None


def css(driver, selector):
    """The first element matching, or None."""
    found = driver.find_elements(By.CSS_SELECTOR, selector)
    return found[0] if found else None


def wait_css(driver, selector, timeout=WAIT_S, what=None):
    return wait_for(driver, what or f"`{selector}`", lambda d: css(d, selector), timeout)


def page(driver, base, path, selector):
    """Opens base+path and waits for `selector` on it."""
    driver.get(base.rstrip("/") + path)
    return wait_css(driver, selector, what=f"`{selector}` on {path}")


def cell(row, col):
    el = row.find_elements(By.CSS_SELECTOR, f'td[data-col="{col}"]')
    check(el, f"row {row.get_attribute('outerHTML')[:200]!r} has a td[data-col={col}]")
    return el[0].text.strip()


def submit(driver, button, what):
    """Clicks the submit button `button` of a POST form and waits for the
    `#flash` it answers with (a new one: a `#flash` already on the page is
    marked first, whether the answer is a new page or an htmx swap);
    returns (classes, text)."""
    driver.execute_script(
        "const f = document.querySelector('#flash'); if (f) f.dataset.lbOld = '1';"
    )
    wait_css(driver, button).click()
    el = wait_css(driver, "#flash:not([data-lb-old])", what=f"#flash after {what}")
    return set((el.get_attribute("class") or "").split()), el.text.strip()


def fill(driver, selector, text):
    el = wait_css(driver, selector)
    el.clear()
    el.send_keys(text)


def post_status(driver, path, fields, with_csrf):
    """POSTs `fields` with fetch() to `path` from the page (same origin, the
    session's cookie), with the session's CSRF token (the value of a
    hidden csrf field of the page) added if `with_csrf`; the response
    status."""
    script = """
      const [path, fields, withCsrf, done] = arguments;
      const body = new URLSearchParams(fields);
      if (withCsrf) {
        const c = document.querySelector('input[type=hidden][name=csrf]');
        if (!c) { done('no hidden csrf field on the page'); return; }
        body.set('csrf', c.value);
      }
      fetch(path, {method: 'POST', body, credentials: 'same-origin'})
        .then(r => done(r.status), e => done('fetch failed: ' + e));
    """
    got = driver.execute_async_script(script, path, fields, with_csrf)
    check(isinstance(got, int), f"POST to {path}: {got}")
    return got


def add_form(driver, form_id, path, fields):
    """Adds to the page a POST form `form_id` to `path` with the hidden
    fields `fields` and the session's CSRF token, and a submit button
    `FORM_ID-submit`: a form the page does not show, submitted as the
    browser submits any form."""
    driver.execute_script(
        """
        const [id, path, fields] = arguments;
        const f = document.createElement('form');
        f.id = id; f.method = 'post'; f.action = path;
        const add = (name, value) => {
          const i = document.createElement('input');
          i.type = 'hidden'; i.name = name; i.value = value; f.appendChild(i);
        };
        const c = document.querySelector('input[type=hidden][name=csrf]');
        if (c) add('csrf', c.value);
        for (const [k, v] of Object.entries(fields)) add(k, v);
        const b = document.createElement('button');
        b.id = id + '-submit'; b.type = 'submit'; b.textContent = id;
        f.appendChild(b);
        document.body.appendChild(f);
        """,
        form_id, path, fields,
    )


def csrf_fields(driver):
    """The POST forms of the page, each with whether it has a csrf field."""
    return driver.execute_script(
        "return [...document.querySelectorAll('form')]"
        ".filter(f => (f.method || '').toLowerCase() === 'post')"
        ".map(f => [f.id || f.action, !!f.querySelector('input[type=hidden][name=csrf]')]);"
    )


def check_csrf_fields(driver, where):
    forms = csrf_fields(driver)
    missing = [name for name, has in forms if not has]
    check(not missing, f"every POST form on {where} has a hidden csrf field; not: {missing}")


def shot(driver, name):
    os.makedirs(SHOTS, exist_ok=True)
    path = os.path.join(SHOTS, name)
    check(driver.save_screenshot(path), f"screenshot {path} saved")
    print(f"   screenshot {path}", flush=True)


# ------------------------------------------------------------- the scenarios


class World:
    """What the scenarios a-e share."""

    def __init__(self, server, rpc, driver):
        self.server, self.rpc, self.driver = server, rpc, driver
        self.url = server.url
        self.dead_id = None


def scenario_a_overview(w):
    """The overview lists queues created over gRPC (after a reload)."""
    d = w.driver
    step("a. open the overview")
    page(d, w.url, "/", "table#queues")
    facts = wait_css(d, "#server-facts")
    for fact in ("version", "uptime", "data_dir", "disk_free", "sync_latency",
                 "commits_per_second"):
        check(
            facts.find_elements(By.CSS_SELECTOR, f'[data-fact="{fact}"]'),
            f'#server-facts has a [data-fact="{fact}"]',
        )
    check(css(d, "form#filter input[name=q]"), "the overview has form#filter with input[name=q]")
    check(css(d, 'tr[data-queue="orders"]') is None, "no orders row before it is created")

    step("a. create orders-dlq, then orders with dead_letter {orders-dlq, 1}, over gRPC")
    w.rpc.create("orders-dlq")
    w.rpc.create("orders", dlq="orders-dlq", max_deliveries=1)

    step("a. reload: both rows appear")
    d.refresh()
    for q in ("orders", "orders-dlq"):
        row = wait_css(d, f'tr[data-queue="{q}"]', what=f"the row of {q} in table#queues")
        for col in ("ready", "in_flight", "delayed", "parked", "dlq_depth", "oldest_age",
                    "publish_rate", "ack_rate", "nack_rate", "dead_letter_rate"):
            cell(row, col)
        check_eq(cell(row, "ready"), "0", f"{q}'s ready cell")
        link = row.find_elements(By.CSS_SELECTOR, "a.queue-link")
        check(link, f"the row of {q} has an a.queue-link")
        href = link[0].get_attribute("href")
        check(href.endswith(f"/queues/{q}"), f"{q}'s link {href!r} goes to /queues/{q}")


def scenario_b_dead_letter(w):
    """A nacked message moves to orders-dlq; its DLQ row shows the record."""
    d = w.driver
    step("b. publish to orders, receive, nack with reason "
         f"{NACK_REASON!r} (max deliveries 1: it moves to orders-dlq)")
    [mid] = w.rpc.publish("orders", '{"order": 1001, "total": "42.00"}',
                          properties={"customer": "acme"})
    [delivery] = w.rpc.receive("orders", 1)
    check_eq(delivery.message_id, mid, "received message id")
    w.rpc.nack(delivery.ack_token, NACK_REASON)
    dead = w.rpc.browse("orders-dlq")
    check_eq([m.message_id for m in dead], [mid], "message ids in orders-dlq (gRPC)")
    rec = dead[0].dead_letters[-1]
    check_eq((rec.source_queue, rec.reason, rec.delivery_count, rec.last_nack_reason),
             ("orders", pb.DEAD_LETTER_REASON_MAX_DELIVERIES, 1, NACK_REASON),
             "the dead-letter record (gRPC)")
    w.dead_id = mid

    step("b. the queue page of orders-dlq links to its dead letters")
    page(d, w.url, "/queues/orders-dlq", "#queue-config")
    link = wait_css(d, "a#dead-letters-link", what="a#dead-letters-link on /queues/orders-dlq")
    href = link.get_attribute("href")
    check(href.endswith("/queues/orders-dlq/dead-letters"),
          f"a#dead-letters-link {href!r} goes to /queues/orders-dlq/dead-letters")
    link.click()
    wait_css(d, "table#dead-letters", what="table#dead-letters after following the link")
    check(css(d, "form#dlq-filter") is not None, "the DLQ page has form#dlq-filter")
    for name in ("source", "reason", "since", "until", "text"):
        check(css(d, f'form#dlq-filter [name="{name}"]'), f"form#dlq-filter has a field {name}")

    step("b. its row: source orders, reason, 1 delivery, the last error")
    row = wait_css(d, f'table#dead-letters tr[data-message-id="{mid}"]',
                   what=f"the row of {mid} in table#dead-letters")
    check_eq(cell(row, "source"), "orders", "source cell")
    reason = cell(row, "reason")
    check("max deliveries" in re.sub(r"[_-]+", " ", reason.lower()),
          f"reason cell {reason!r} says max deliveries (DEAD_LETTER_REASON_MAX_DELIVERIES)")
    check_eq(cell(row, "deliveries"), "1", "deliveries cell")
    last_error = cell(row, "last_error")
    check(NACK_REASON in last_error, f"last_error cell {last_error!r} has {NACK_REASON!r}")
    check(cell(row, "dead_lettered_at"), "dead_lettered_at cell is not empty")

    step("b. the overview after it: screenshot overview.png")
    page(d, w.url, "/", 'tr[data-queue="orders-dlq"]')
    row = css(d, 'tr[data-queue="orders-dlq"]')
    check_eq(cell(row, "ready"), "1", "orders-dlq's ready cell on the overview")
    shot(d, "overview.png")


def scenario_c_redrive(w):
    """Redrive from the DLQ page: preview, confirm, the job finishes, and
    the message is back in orders."""
    d = w.driver
    mid = w.dead_id
    check(mid, "scenario b left a dead letter")
    step("c. tick the message's checkbox and preview the redrive")
    page(d, w.url, "/queues/orders-dlq/dead-letters", "form#redrive")
    check_csrf_fields(d, "the DLQ page")
    box = wait_css(d, f'form#redrive input[type=checkbox][name=id][value="{mid}"]',
                   what=f"the checkbox of {mid} in form#redrive")
    if not box.is_selected():
        box.click()
    check(box.is_selected(), "the checkbox is ticked")
    target = css(d, "form#redrive input[name=target]")
    check(target is not None, "form#redrive has input[name=target]")
    check_eq(target.get_attribute("value"), "",
             "input[name=target] defaults to '' (back to each message's source)")
    check(css(d, "form#redrive input[name=rate]"), "form#redrive has input[name=rate]")
    check(css(d, "form#redrive input#all-matching[name=all]"),
          "form#redrive has input#all-matching (name=all)")
    wait_css(d, "button#redrive-preview").click()

    plan = wait_css(d, "#redrive-plan", what="#redrive-plan after the preview")
    check_eq(plan.get_attribute("data-count"), "1", "#redrive-plan data-count")
    text = plan.text
    check(re.search(r"(?<![\w-])orders(?![\w-])", text) is not None,
          f"#redrive-plan's text {text!r} names the destination queue orders")
    dest = w.rpc.stats("orders")
    check_eq(dest.total, 0, "orders is still empty after the preview (a dry run)")
    shot(d, "dlq-redrive-preview.png")

    step("c. confirm: the job page reaches done with moved=1")
    wait_css(d, "button#redrive-confirm").click()
    wait_for(d, "the redirect to /jobs/JOBID",
             lambda d: "/jobs/" in d.current_url and css(d, "#redrive-progress"))

    def finished(d):
        el = css(d, "#redrive-progress")
        state = el.get_attribute("data-state") if el else None
        return (state, el.get_attribute("data-moved"), el.text) if state in (
            "done", "failed") else None

    state, moved, text = wait_for(d, "#redrive-progress data-state done", finished,
                                  timeout=JOB_WAIT_S)
    check_eq(state, "done", f"the redrive job's state (its text: {text!r})")
    check_eq(moved, "1", "#redrive-progress data-moved")

    step("c. over gRPC: the message is back in orders, orders-dlq is empty")
    check_eq(w.rpc.stats("orders").total, 1, "orders' total")
    check_eq([m.message_id for m in w.rpc.browse("orders")], [mid],
             "message ids in orders after the redrive")
    check_eq(w.rpc.stats("orders-dlq").total, 0, "orders-dlq's total")


def scenario_d_purge(w):
    """Purge needs the queue's name typed."""
    d = w.driver
    step("d. purge orders with a wrong confirmation: refused, nothing purged")
    before = w.rpc.stats("orders").total
    check(before > 0, f"orders has something to purge ({before})")
    page(d, w.url, "/queues/orders", "form#purge")
    check_csrf_fields(d, "the queue page")
    fill(d, "form#purge input[name=confirm]", "order")
    classes, text = submit(d, "button#purge-submit", "a purge with the wrong confirmation")
    check("error" in classes and "ok" not in classes,
          f"#flash after a wrong confirmation is class error, got {classes} ({text!r})")
    check_eq(w.rpc.stats("orders").total, before, "orders' total after the refused purge")

    step("d. purge with the name typed: ok, the queue is empty")
    fill(d, "form#purge input[name=confirm]", "orders")
    classes, text = submit(d, "button#purge-submit", "the purge with the name typed")
    check("ok" in classes and "error" not in classes,
          f"#flash after the purge with the name typed is class ok, got {classes} ({text!r})")
    check_eq(w.rpc.stats("orders").total, 0, "orders' total after the purge")


def scenario_e_plot(w):
    """The queue page of a queue with traffic: messages listed, a publish
    through the form, and the depth plot draws."""
    d = w.driver
    step("e. traffic on orders: publish 5 over gRPC, receive 2 and ack them")
    ids = w.rpc.publish("orders", *[f'{{"order": {1002 + i}}}' for i in range(5)])
    got = w.rpc.receive("orders", 2)
    w.rpc.ack([x.ack_token for x in got])
    left = [i for i in ids if i not in {x.message_id for x in got}]

    step("e. the queue page lists the 3 left in table#messages")
    page(d, w.url, "/queues/orders", "table#messages")
    for mid in left:
        wait_css(d, f'table#messages tr[data-message-id="{mid}"]',
                 what=f"the row of {mid} in table#messages")

    # (The console shows the group id field on FIFO queues only; orders is
    # a standard queue.)
    step("e. publish one through form#publish (body, properties)")
    fill(d, "form#publish textarea[name=body]", "from the console")
    fill(d, "form#publish textarea[name=properties]", "source=console\ntrace=e2e")
    classes, text = submit(d, "form#publish button, form#publish input[type=submit]",
                           "the publish form")
    check("ok" in classes, f"#flash after publishing is ok, got {classes} ({text!r})")
    published = [m for m in w.rpc.browse("orders") if m.body == b"from the console"]
    check_eq(len(published), 1, "messages with the form's body in orders (gRPC)")
    check_eq(dict(published[0].properties), {"source": "console", "trace": "e2e"},
             "the published message's properties")

    step("e. a few seconds of traffic, for the plots: publish, receive, ack")
    for i in range(8):
        w.rpc.publish("orders", *[f'{{"tick": {i}, "n": {k}}}' for k in range(3 + i % 3)])
        got = w.rpc.receive("orders", 2)
        w.rpc.ack([x.ack_token for x in got])
        # Pacing the workload over several samples, not waiting for a
        # condition.
        time.sleep(0.4)

    step("e. the depth plot draws (#plot-depth canvas with pixels)")
    page(d, w.url, "/queues/orders", "#plot-depth")
    check(css(d, "#plot-rates") is not None, "the queue page has #plot-rates")
    count = """
      const c = document.querySelector('#plot-depth canvas');
      if (!c || !c.width || !c.height) return 0;
      const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
      let n = 0;
      for (let i = 3; i < px.length; i += 4) if (px[i] > 0) n++;
      return n;
    """
    n = wait_for(d, "non-transparent pixels in #plot-depth canvas",
                 lambda d: d.execute_script(count), timeout=PLOT_WAIT_S)
    print(f"   {n} pixels drawn", flush=True)
    shot(d, "queue.png")


def scenario_f_principals(tmp):
    """With principals: login, a reader cannot purge, CSRF is required."""
    from hashlib import sha256

    def digest(t):
        return sha256(t.encode()).hexdigest()

    config = os.path.join(tmp, "principals.toml")
    with open(config, "w") as f:
        f.write(
            f'[[principals]]\nname = "admin"\ntoken_sha256 = ["{digest(ADMIN_TOKEN)}"]\n'
            'admin = ["*"]\npublish = ["*"]\nconsume = ["*"]\n\n'
            f'[[principals]]\nname = "reader"\ntoken_sha256 = ["{digest(READER_TOKEN)}"]\n'
            'consume = ["*"]\n'
        )
    server = rpc = d = None
    try:
        step("f. a second server with principals admin and reader")
        server = start_server(tmp, "auth", ["--config", config])
        rpc = Grpc(server.addr, ADMIN_TOKEN)
        rpc.create("orders")
        rpc.publish("orders", "one", "two")
        d = new_browser()

        step("f. without a login, / leads to the login form")
        d.get(server.url)
        wait_css(d, "form#login", what="form#login when opening / without a session")
        print(f"   / without a session shows {d.current_url}", flush=True)
        for name in ("token", "client_id", "secret"):
            check(css(d, f'form#login input[name="{name}"]'), f"form#login has input {name}")
        check(css(d, "table#queues") is None, "no queue table without a session")

        step("f. log in as reader with its token: the overview shows")
        login(d, server.url, READER_TOKEN)
        wait_css(d, 'table#queues tr[data-queue="orders"]',
                 what="the overview with the orders row after the reader's login")
        check(d.get_cookie("letterbox_session") is not None,
              f"a letterbox_session cookie is set; cookies: {[c['name'] for c in d.get_cookies()]}")

        step("f. the reader submits a purge, rightly confirmed: refused")
        purge = "/queues/orders/purge"
        page(d, server.url, "/queues/orders", "table#messages")
        check_csrf_fields(d, "the queue page (reader)")
        if css(d, "form#purge") is not None:
            fill(d, "form#purge input[name=confirm]", "orders")
            button = "button#purge-submit"
        else:
            # The console does not show the purge form to a principal who
            # may not purge: the browser submits the same form anyway.
            print("   (no purge form shown to the reader: submitting one made in the page)")
            add_form(d, "forged-purge", purge, {"confirm": "orders"})
            button = "button#forged-purge-submit"
        classes, text = submit(d, button, "the reader's purge")
        check("error" in classes, f"#flash after the reader's purge is error, got {classes}")
        check("reader" in text and "admin" in text,
              f"#flash {text!r} names the principal (reader) and the permission (admin)")
        check_eq(rpc.stats("orders").total, 2, "orders' total after the reader's purge")
        page(d, server.url, "/queues/orders", "table#messages")
        status = post_status(d, purge, {"confirm": "orders"}, with_csrf=True)
        check_eq(status, 403, "status of the reader's purge POST (with its csrf field)")

        step("f. a POST without the csrf field is refused (reader)")
        status = post_status(d, purge, {"confirm": "orders"}, with_csrf=False)
        check_eq(status, 403, "status of a POST without csrf (reader)")
        check_eq(rpc.stats("orders").total, 2, "orders' total after the reader's POSTs")

        step("f. as admin: without the csrf field refused, with it purged")
        d.delete_all_cookies()
        login(d, server.url, ADMIN_TOKEN)
        wait_css(d, "table#queues", what="the overview after the admin's login")
        page(d, server.url, "/queues/orders", "form#purge")
        action = css(d, "form#purge").get_attribute("action")
        check(urlparse(action).path == purge, f"form#purge posts to {purge}, not {action!r}")
        status = post_status(d, purge, {"confirm": "orders"}, with_csrf=False)
        check_eq(status, 403, "status of a POST without csrf (admin)")
        check_eq(rpc.stats("orders").total, 2, "orders' total after the POST without csrf")
        fill(d, "form#purge input[name=confirm]", "orders")
        classes, text = submit(d, "button#purge-submit", "the admin's purge")
        check("ok" in classes, f"#flash after the admin's purge is ok, got {classes} ({text!r})")
        check_eq(rpc.stats("orders").total, 0, "orders' total after the admin's purge")
    except Exception:
        if d is not None:
            report_page(d, "f-principals")
        if server is not None:
            print(f"--- server auth log (tail) ---\n{server.log_tail()}", file=sys.stderr)
        raise
    finally:
        if d is not None:
            d.quit()
        if rpc is not None:
            rpc.close()
        if server is not None:
            server.close()


def login(d, base, token):
    page(d, base, "/login", "form#login")
    fill(d, "form#login input[name=token]", token)
    wait_css(d, "button#login-submit").click()
    wait_for(d, "leaving /login after logging in",
             lambda d: urlparse(d.current_url).path != "/login" or css(d, "#flash.error"))
    err = css(d, "#flash.error")
    check(err is None, f"login refused: {err.text if err else ''}")


# ------------------------------------------------------------------ the run


def report_page(driver, name):
    """On failure: a screenshot in failures/, the URL and the page's text."""
    try:
        path = os.path.join(SHOTS, "failures")
        os.makedirs(path, exist_ok=True)
        driver.save_screenshot(os.path.join(path, f"{name}.png"))
        body = driver.find_elements(By.TAG_NAME, "body")
        text = body[0].text if body else driver.page_source
        print(f"--- page at failure: {driver.current_url} "
              f"(screenshot {path}/{name}.png) ---\n{text[:3000]}", file=sys.stderr)
    except WebDriverException as e:
        print(f"(no page to show: {e})", file=sys.stderr)


def describe(e):
    if isinstance(e, grpc.RpcError):
        return f"unexpected RPC error {e.code()}: {e.details()}"
    if isinstance(e, (CheckFailed, subprocess.TimeoutExpired)):
        return str(e)
    if isinstance(e, (WebDriverException, JavascriptException)):
        return f"{type(e).__name__}: {e.msg}"
    return "".join(traceback.format_exception(e)).rstrip()


def main():
    check(os.access(SERVER_BIN, os.X_OK),
          f"server binary {SERVER_BIN} (cargo build --bin letterbox)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = tempfile.mkdtemp(prefix="letterbox-console-")
    failures = []
    server = rpc = driver = None
    try:
        try:
            server = start_server(tmp, "main")
            rpc = Grpc(server.addr)
            driver = new_browser()
            print(f"browser: {driver.capabilities.get('browserName')} "
                  f"{driver.capabilities.get('browserVersion')}", flush=True)
            w = World(server, rpc, driver)
            for scenario in (scenario_a_overview, scenario_b_dead_letter, scenario_c_redrive,
                             scenario_d_purge, scenario_e_plot):
                try:
                    scenario(w)
                except Exception as e:
                    name = scenario.__name__[len("scenario_"):]
                    failures.append((name, describe(e)))
                    report_page(driver, name)
                    print(f"--- server main log (tail) ---\n{server.log_tail()}",
                          file=sys.stderr)
                    print(f"(the scenarios after {name} build on it: not run)", file=sys.stderr)
                    break
            if not failures:
                step("SIGTERM the server")
                driver.quit()
                driver = None
                rpc.close()
                rpc = None
                check_eq(server.terminate(), 0, "server exit code after SIGTERM")
        except Exception as e:
            failures.append(("setup", describe(e)))
        try:
            scenario_f_principals(tmp)
        except Exception as e:
            failures.append(("f_principals", describe(e)))
    finally:
        if driver is not None:
            driver.quit()
        if rpc is not None:
            rpc.close()
        if server is not None:
            server.close()
        shutil.rmtree(tmp, ignore_errors=True)
    for name, why in failures:
        print(f"FAIL: {name}: {why}", file=sys.stderr)
    if failures:
        return 1
    print("PASS: the console in a browser against a real server")
    return 0


if __name__ == "__main__":
    sys.exit(main())
