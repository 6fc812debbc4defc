#!/usr/bin/env python3
"""Contract test of Letterbox's Anypoint MQ REST facade against MuleSoft's
official OpenAPI specifications (tests/anypoint/openapi/, Apache-2.0).

Two parts, against a real server (LETTERBOX_BIN) on a fresh data directory:

1. A scripted session, as an Anypoint REST client runs it (authorize, admin
   setup, publish, consume, lock TTL, nack, ack, stats, teardown, and the
   error cases), where every answer is checked against the specification of
   its operation: the status must be one the operation documents, and a
   JSON body must validate against the operation's response schema (the
   Admin and Stats specifications give examples instead of schemas for most
   answers: there every key the answer shares with the example must have the
   example's JSON type, and the example's keys must be present).

2. schemathesis, generating requests from the specifications (examples,
   coverage and fuzzing phases, fixed seed, one worker: reproducible) and
   running its checks on every answer: no server error, documented status
   codes and content types, response schemas, invalid requests rejected,
   valid requests accepted (Broker API), authentication not ignored.

Where Letterbox deliberately answers otherwise than the specification
says, or the specification is looser than the API it describes, the test
applies a deviation to a copy of the specification (written to
target/anypoint-contract/) and prints it: DEVIATIONS below is the complete
list, and docs/anypoint.md ("Decisions where the specification is
ambiguous or Letterbox differs") describes the same choices.

Prints "PASS: anypoint contract" at the end when everything held.
"""

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jsonschema_rs
import requests
import yaml

ROOT = Path(__file__).resolve().parents[2]
SPECS = ROOT / "tests" / "anypoint" / "openapi"
WORK = ROOT / "target" / "anypoint-contract"
BIN = os.environ.get("LETTERBOX_BIN", str(ROOT / "target" / "debug" / "letterbox"))
ST = Path(sys.executable).parent / "st"
ORG, ENV, REGION = "contract-org", "contract-env", "us-east-1"

MSGS = "/organizations/{organizationId}/environments/{environmentId}/destinations/{destinationId}/messages"
ADMIN = "/v1/organizations/{organizationId}/environments/{environmentId}/regions/{regionId}"
STATS = "/organizations/{organizationId}/environments/{environmentId}/regions/{regionId}"

# Cc characters, which the engine refuses in ids.
NO_CONTROL = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
NAME = "^[A-Za-z0-9][A-Za-z0-9._-]{0,126}$"

DEVIATIONS = []


def deviation(spec, text):
    DEVIATIONS.append(f"{spec}: {text}")


def ops(spec):
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method in ("get", "put", "post", "patch", "delete"):
                yield path, method, op


def patch_broker(s):
    paths, comp = s["paths"], s["components"]["schemas"]
    for p in (MSGS, MSGS + "/locks"):
        content = paths[p]["delete"]["responses"]["200"]["content"]["application/json"]
        content["schema"] = {
            "type": "array",
            "items": {"$ref": "#/components/schemas/ackNackBatchResponse"},
        }
        content.pop("example", None)
    comp["ackNackBatchResponse"]["properties"]["lockId"] = {"type": "string"}
    comp["ackNackBatchResponse"].pop("example", None)
    deviation(
        "broker",
        "batch ack (DELETE .../messages) and batch nack (DELETE .../messages/locks) answer an "
        "array with one {messageId, lockId, status, statusMessage} per item (the schema says one "
        "object; the description says a status per operation, and batch lock TTL answers an array)",
    )
    comp["ack"]["required"] = ["lockId"]
    comp["ackNackBatch"]["items"]["required"] = ["messageId", "lockId"]
    for body in s["components"]["requestBodies"].values():
        body["required"] = True
    for path, method, op in ops(s):
        if "requestBody" in op:
            op["requestBody"]["required"] = True
    deviation(
        "broker",
        "every operation that takes a body needs it; an ack needs its lockId, a batch ack or "
        "nack item its messageId and lockId",
    )
    headers = comp["sendBatch"]["items"]["properties"]["headers"]["properties"]
    headers["deliveryDelay"].update(minimum=0, maximum=900000)
    comp["sendBatch"]["items"]["properties"]["properties"].update(
        maxProperties=63, propertyNames={"minLength": 1}
    )
    deviation(
        "broker",
        "headers.messageId is 1 to 256 characters without control characters (as the path's "
        "messageId is 1 to 256); deliveryDelay is 0 to 900000 ms (15 minutes); properties have "
        "non-empty names, at most 63 of them (64 with Letterbox's own anypoint.meta)",
    )
    single = paths[MSGS + "/{messageId}"]["put"]
    item = copy.deepcopy(comp["sendBatch"]["items"])
    item["properties"]["headers"]["required"] = []
    item["required"] = ["body"]
    headers["messageId"].update(minLength=1, maxLength=256, pattern=NO_CONTROL)
    comp["sendBatch"].update(minItems=1, maxItems=10)
    single["requestBody"]["content"]["application/json"]["schema"] = item
    for p in single["parameters"]:
        if p.get("name") == "messageId":
            p["schema"]["pattern"] = NO_CONTROL
    deviation(
        "broker",
        "the single publish's body has the schema of a batch item (the specification gives only "
        "an example); the message id is the path's; a batch holds 1 to 10 messages (as the "
        "description says)",
    )
    for name in ("modifyTtl",):
        comp[name]["properties"]["ttl"].update(minimum=1, maximum=43200000)
    comp["modifyTtlBatch"]["items"]["properties"]["ttl"].update(minimum=1, maximum=43200000)
    deviation(
        "broker",
        "a lock TTL PATCH's ttl is in milliseconds (--anypoint-lock-ttl-unit, default ms), 1 to "
        "43200000 (12 hours, as the description says)",
    )
    for path, method, op in ops(s):
        if path != "/authorize":
            op["responses"].setdefault(
                "401", {"description": "The bearer token is missing, unknown or expired."}
            )
    deviation("broker", "401 when the bearer token is missing, unknown or expired")


def admin_extra(op, codes, why):
    for c in codes:
        op["responses"].setdefault(str(c), {"description": why})


def patch_admin(s):
    paths = s["paths"]
    for path, method, op in ops(s):
        if path == "/v1/authorize":
            continue
        admin_extra(op, [400], "Invalid request (a value out of range, a name Letterbox refuses).")
        admin_extra(op, [401, 403], "No valid bearer token / not allowed.")
        for p in op.get("parameters", []):
            if p.get("name") == "startsWith":
                p["required"] = False
            if p.get("name") in ("queueId", "exchangeId") and p.get("in") == "path":
                p["schema"]["pattern"] = NAME
    deviation("admin", "400, 401 and 403 may answer any operation")
    deviation("admin", "startsWith is optional (empty: every name)")
    deviation(
        "admin",
        "queue and exchange ids are Letterbox names: letters, digits, '.', '_', '-', 1 to 127",
    )
    binding = paths[ADMIN + "/bindings/exchanges/{exchangeId}/queues/{queueId}"]
    for m in ("put", "get"):
        binding[m]["responses"]["200"] = {
            "description": "The binding.",
            "content": {
                "application/json": {
                    "schema": {
                        "type": "object",
                        "required": ["exchangeId", "queueId"],
                        "properties": {
                            "exchangeId": {"type": "string"},
                            "queueId": {"type": "string"},
                        },
                    }
                }
            },
        }
    deviation(
        "admin",
        "PUT and GET of a binding answer 200 {exchangeId, queueId} (the specification lists no "
        "success status)",
    )
    for p in ("/v1/organizations/{organizationId}/environments/{environmentId}/regions",
              "/v1/organizations/{organizationId}/environments/{environmentId}/regions/{regionId}"):
        paths[p]["get"]["responses"].setdefault("501", {"description": "Not implemented by this broker."})
    deviation(
        "admin",
        "the regions calls answer 501 (one local server, no regions), as the operations Letterbox "
        "lacks do elsewhere in the specification",
    )
    queue = paths[ADMIN + "/destinations/queues/{queueId}"]
    queue["delete"]["responses"].setdefault(
        "409", {"description": "The queue is the dead letter queue of another."}
    )
    for m in ("put", "patch"):
        queue[m]["responses"].setdefault(
            "409", {"description": "Created meanwhile with another configuration."}
        )


def patch_stats(s):
    for path, method, op in ops(s):
        admin_extra(op, [400], "destinationIds missing.")
        admin_extra(op, [401, 403], "No valid bearer token / not allowed.")
    deviation("stats", "400 without destinationIds; 401 and 403 as everywhere")


# ---- the server ---------------------------------------------------------------


def start_server(tmp):
    log = open(Path(tmp) / "server.log", "w")
    proc = subprocess.Popen(
        [
            BIN, "serve", "--data-dir", str(Path(tmp) / "data"),
            "--listen", "127.0.0.1:0", "--anypoint-listen", "127.0.0.1:0",
            "--wal-segment-size", "1MiB", "--min-free-disk", "0",
        ],
        stdout=subprocess.PIPE, stderr=log, text=True,
    )
    first = proc.stdout.readline().strip()
    second = proc.stdout.readline().strip()
    prefix = "letterbox anypoint listening on "
    if not second.startswith(prefix):
        proc.kill()
        raise SystemExit(f"server did not start: {first!r} {second!r}\n" + (Path(tmp) / "server.log").read_text())
    return proc, "http://" + second[len(prefix):]


# ---- response validation --------------------------------------------------------


def resolve(spec, node):
    if isinstance(node, dict):
        if "$ref" in node:
            target = spec
            for part in node["$ref"].lstrip("#/").split("/"):
                target = target[part]
            return resolve(spec, target)
        return {k: resolve(spec, v) for k, v in node.items() if k not in ("example", "x-amf-mediaType")}
    if isinstance(node, list):
        return [resolve(spec, v) for v in node]
    return node


def json_type(v):
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object", type(None): "null"}[type(v)]


class Checker:
    """Checks answers against one patched specification."""

    def __init__(self, name, spec, base, optional_keys=()):
        self.name, self.spec, self.base = name, spec, base
        self.optional = set(optional_keys)
        self.checked = 0

    def op(self, method, template):
        return self.spec["paths"][template][method]

    def check(self, method, template, resp, expect):
        where = f"{self.name} {method.upper()} {template} -> {resp.status_code}"
        assert resp.status_code == expect, f"{where}: expected {expect}: {resp.text}"
        op = self.op(method, template)
        documented = op["responses"].get(str(resp.status_code))
        assert documented is not None, f"{where}: status not documented ({sorted(op['responses'])})"
        if not resp.content:
            self.checked += 1
            return None
        assert resp.headers.get("content-type", "").startswith("application/json"), where
        body = resp.json()
        content = documented.get("content", {}).get("application/json", {})
        schema = resolve(self.spec, content.get("schema", {}))
        if schema.get("type") or schema.get("properties") or schema.get("items"):
            jsonschema_rs.validator_for(schema).validate(body)
        else:
            example = content.get("example", schema.get("example"))
            if example is None:
                example = content.get("schema", {}).get("example")
            if example is not None:
                self.like(where, body, example)
        self.checked += 1
        return body

    def like(self, where, body, example):
        """`body` has the shape of `example`."""
        if isinstance(example, list):
            assert isinstance(body, list), f"{where}: {body} is not an array like {example}"
            for item in body:
                candidates = [e for e in example if isinstance(e, dict) and set(e) & set(item)]
                self.like(where, item, max(candidates, key=lambda e: len(set(e) & set(item))) if candidates else example[0])
            return
        if isinstance(example, dict):
            assert isinstance(body, dict), f"{where}: {body} is not an object like {example}"
            for k, v in example.items():
                if k in body:
                    assert json_type(body[k]) == json_type(v) or {json_type(body[k]), json_type(v)} <= {"integer", "number"}, (
                        f"{where}: {k} is {json_type(body[k])} ({body[k]!r}), the example's is {json_type(v)}"
                    )
                elif k not in self.optional:
                    raise AssertionError(f"{where}: {k} is missing from {body}")
            return


def session(base, broker, admin, stats):
    """The scripted session; returns the number of answers checked."""
    s = requests.Session()
    b = f"/api/v1/organizations/{ORG}/environments/{ENV}/destinations"
    a = f"/mq/admin/api/v1/organizations/{ORG}/environments/{ENV}/regions/{REGION}"
    st = f"/mq/stats/api/v1/organizations/{ORG}/environments/{ENV}/regions/{REGION}"

    def call(method, path, **kw):
        return s.request(method, base + path, timeout=30, **kw)

    # Authorize.
    r = call("POST", "/api/v1/authorize", data={"client_id": "contract", "client_secret": "x", "grant_type": "client_credentials"})
    token = broker.check("post", "/authorize", r, 200)["access_token"]
    broker.check("post", "/authorize", call("POST", "/api/v1/authorize", data={"client_id": "c"}), 401)
    admin.check("post", "/v1/authorize", call("POST", "/mq/admin/api/v1/authorize", data={"client_id": "contract", "client_secret": "x", "grant_type": "client_credentials"}), 200)
    s.headers["Authorization"] = f"bearer {token}"

    # Admin: queues, exchange, binding, rule.
    q = ADMIN + "/destinations/queues/{queueId}"
    admin.check("put", q, call("PUT", a + "/destinations/queues/s-dlq", json={}), 200)
    body = admin.check("put", q, call("PUT", a + "/destinations/queues/s-orders", json={
        "defaultTtl": 3600000, "defaultLockTtl": 10000, "defaultDeliveryDelay": 0, "encrypted": False,
        "deadLetterQueueId": "s-dlq", "maxDeliveries": 2}), 200)
    assert body["deadLetterQueueId"] == "s-dlq", body
    body = admin.check("get", q, call("GET", a + "/destinations/queues/s-dlq"), 200)
    assert body["deadLetterSources"] == ["s-orders"], body
    admin.check("get", q, call("GET", a + "/destinations/queues/missing"), 404)
    admin.check("patch", q, call("PATCH", a + "/destinations/queues/s-orders", json={"deadLetterQueueId": "s-dlq", "maxDeliveries": 2, "defaultLockTtl": 10000}), 200)
    admin.check("put", q, call("PUT", a + "/destinations/queues/s-orders", json={"defaultLockTtl": 10}), 400)
    x = ADMIN + "/destinations/exchanges/{exchangeId}"
    admin.check("put", x, call("PUT", a + "/destinations/exchanges/s-x", json={"encrypted": False}), 200)
    admin.check("get", x, call("GET", a + "/destinations/exchanges/s-x"), 200)
    admin.check("patch", x, call("PATCH", a + "/destinations/exchanges/s-x", json={"encrypted": False}), 200)
    admin.check("put", q, call("PUT", a + "/destinations/queues/s-eu", json={}), 200)
    bq = ADMIN + "/bindings/exchanges/{exchangeId}/queues/{queueId}"
    admin.check("put", bq, call("PUT", a + "/bindings/exchanges/s-x/queues/s-eu"), 200)
    admin.check("get", bq, call("GET", a + "/bindings/exchanges/s-x/queues/s-eu"), 200)
    rules = bq + "/rules/routing"
    admin.check("put", rules, call("PUT", a + "/bindings/exchanges/s-x/queues/s-eu/rules/routing", json={"routingRules": [
        {"propertyName": "region", "propertyType": "STRING", "matcherType": "EQ", "value": "EU"}]}), 201)
    admin.check("put", rules, call("PUT", a + "/bindings/exchanges/s-x/queues/s-eu/rules/routing", json={"routingRules": [
        {"propertyName": "n", "propertyType": "NUMERIC", "matcherType": "GT", "value": 1}]}), 501)
    admin.check("get", ADMIN + "/bindings/exchanges/{exchangeId}", call("GET", a + "/bindings/exchanges/s-x"), 200)
    admin.check("get", ADMIN + "/bindings/queues/{queueId}", call("GET", a + "/bindings/queues/s-eu"), 200)
    admin.check("get", ADMIN + "/destinations", call("GET", a + "/destinations"), 200)
    admin.check("get", ADMIN + "/destinations", call("GET", a + "/destinations", params={"startsWith": "nothing-"}), 204)

    # Broker: publish, consume, lock TTL, nack, ack.
    one = MSGS + "/{messageId}"
    lock_path = MSGS + "/{messageId}/locks/{lockId}"
    r = call("PUT", b + "/s-orders/messages", json=[
        {"headers": {"messageId": "m-1"}, "properties": {"n": 1009, "s": "x"}, "body": "one"},
        {"headers": {"messageId": "m-2", "deliveryDelay": 0}, "properties": {}, "body": "two"},
        {"headers": {"messageId": "m-3"}, "body": "three"},
    ])
    assert [i["status"] for i in broker.check("put", MSGS, r, 200)] == ["successful"] * 3
    broker.check("put", one, call("PUT", b + "/s-orders/messages/m-4", json={"properties": {}, "body": "four"}), 201)
    broker.check("put", one, call("PUT", b + "/s-x/messages/m-x", json={"properties": {"region": "EU"}, "body": "routed"}), 201)
    broker.check("put", one, call("PUT", b + "/nowhere/messages/m", json={"body": "x"}), 404)
    broker.check("put", MSGS, call("PUT", b + "/s-orders/messages", json=[]), 400)
    got = broker.check("get", MSGS, call("GET", b + "/s-orders/messages", params={"batchSize": 10, "pollingTime": 0, "lockTtl": 60000}), 200)
    assert [m["headers"]["messageId"] for m in got] == ["m-1", "m-2", "m-3", "m-4"], got
    assert got[0]["properties"] == {"n": 1009, "s": "x"}, got[0]
    broker.check("get", MSGS, call("GET", b + "/s-orders/messages", params={"pollingTime": 0}), 204)
    broker.check("get", MSGS, call("GET", b + "/nowhere/messages", params={"pollingTime": 0}), 404)
    broker.check("get", MSGS, call("GET", b + "/s-orders/messages", params={"batchSize": 11}), 400)
    lk = [m["headers"]["lockId"] for m in got]
    broker.check("patch", lock_path, call("PATCH", f"{b}/s-orders/messages/m-1/locks/{lk[0]}", json={"ttl": 120000}), 200)
    r = call("PATCH", b + "/s-orders/messages/locks", json=[
        {"messageId": "m-2", "lockId": lk[1], "ttl": 120000},
        {"messageId": "m-3", "lockId": "not-a-lock", "ttl": 1000}])
    assert [i["status"] for i in broker.check("patch", MSGS + "/locks", r, 200)] == ["successful", "failure"]
    broker.check("delete", lock_path, call("DELETE", f"{b}/s-orders/messages/m-1/locks/{lk[0]}"), 200)
    r = call("DELETE", b + "/s-orders/messages/locks", json=[{"messageId": "m-2", "lockId": lk[1]}])
    assert broker.check("delete", MSGS + "/locks", r, 200)[0]["status"] == "successful"
    broker.check("delete", one, call("DELETE", b + "/s-orders/messages/m-3", json={"lockId": lk[2]}), 200)
    r = call("DELETE", b + "/s-orders/messages", json=[{"messageId": "m-4", "lockId": lk[3]}, {"messageId": "m-3", "lockId": lk[2]}])
    assert [i["status"] for i in broker.check("delete", MSGS, r, 200)] == ["successful", "failure"]
    # An expired lock: 400 "LockId: ... provided is expired".
    r = call("DELETE", b + "/s-orders/messages/m-3", json={"lockId": lk[2]})
    broker.check("delete", one, r, 400)
    assert r.json() == {"status": "failure", "statusMessage": f"LockId: {lk[2]} provided is expired"}, r.text
    again = broker.check("get", MSGS, call("GET", b + "/s-orders/messages", params={"batchSize": 10, "pollingTime": 0}), 200)
    assert sorted(m["headers"]["messageId"] for m in again) == ["m-1", "m-2"], again
    assert all(m["headers"]["deliveryCount"] == "2" for m in again), again
    for m in again:
        h = m["headers"]
        broker.check("delete", lock_path, call("DELETE", f"{b}/s-orders/messages/{h['messageId']}/locks/{h['lockId']}"), 200)
    dead = broker.check("get", MSGS, call("GET", b + "/s-dlq/messages", params={"batchSize": 10, "pollingTime": 0}), 200)
    assert sorted(m["headers"]["messageId"] for m in dead) == ["m-1", "m-2"], dead

    # Every operation of the Admin and Stats specifications is routed: it is
    # served, or answers 501 naming itself; never "no such operation" (404)
    # or 405.
    not_implemented = []
    for name, checker, root in (("admin", admin, "/mq/admin/api"), ("stats", stats, "/mq/stats/api/v1")):
        for path, method, op in ops(checker.spec):
            if path.endswith("/authorize"):
                continue
            concrete = path
            for k, v in (("{organizationId}", ORG), ("{environmentId}", ENV), ("{regionId}", REGION),
                         ("{queueId}", "sweep-q"), ("{exchangeId}", "sweep-x"), ("{clientId}", "sweep-c")):
                concrete = concrete.replace(k, v)
            r = call(method.upper(), root + concrete, json={}, params={"destinationIds": "sweep-q"})
            where = f"{name} {method.upper()} {path} -> {r.status_code}: {r.text}"
            assert r.status_code != 405, where
            assert not (r.status_code == 404 and "no such operation" in r.text), where
            if r.status_code == 501:
                checker.check(method, path, r, 501)
                assert r.json()["operation"] == f"{method.upper()} {path}", where
                not_implemented.append(f"{name} {method.upper()} {path}")
    print(f"   {len(not_implemented)} Admin and Stats operations answer 501 (not implemented):")
    for n in not_implemented:
        print(f"     {n}")
    assert len(not_implemented) == 13, not_implemented

    # Stats, then teardown.
    r = call("GET", st + "/queues", params={"destinationIds": "s-orders,s-dlq,s-eu"})
    figures = stats.check("get", STATS + "/queues", r, 200)
    assert figures == [
        {"destination": "s-orders", "messages": 0, "inflightMessages": 0},
        {"destination": "s-dlq", "messages": 2, "inflightMessages": 2},
        {"destination": "s-eu", "messages": 1, "inflightMessages": 0},
    ], figures
    stats.check("get", STATS + "/queues", call("GET", st + "/queues"), 400)
    admin.check("delete", q + "/messages", call("DELETE", a + "/destinations/queues/s-dlq/messages"), 204)
    admin.check("delete", rules, call("DELETE", a + "/bindings/exchanges/s-x/queues/s-eu/rules/routing"), 204)
    admin.check("delete", bq, call("DELETE", a + "/bindings/exchanges/s-x/queues/s-eu"), 204)
    admin.check("delete", x, call("DELETE", a + "/destinations/exchanges/s-x"), 204)
    admin.check("delete", q, call("DELETE", a + "/destinations/queues/s-orders"), 204)
    admin.check("delete", q, call("DELETE", a + "/destinations/queues/s-orders"), 404)

    # Without a token.
    del s.headers["Authorization"]
    broker.check("get", MSGS, call("GET", b + "/s-eu/messages", params={"pollingTime": 0}), 401)
    return broker.checked + admin.checked + stats.checked


# ---- schemathesis -------------------------------------------------------------------


def schemathesis(name, spec_file, url, token, include_regex):
    cfg = ROOT / "tests" / "anypoint" / f"{name}.schemathesis.toml"
    cmd = [
        str(ST), "--config-file", str(cfg), "--no-color", "run", str(spec_file), "--url", url,
        "-H", f"Authorization: bearer {token}",
        "--max-examples", "20", "--seed", "20261129",
        "--workers", "1", "--phases", "examples,coverage,fuzzing",
        "--request-timeout", "30",
        "--include-path-regex", include_regex,
    ]
    started = time.monotonic()
    out = subprocess.run(cmd, cwd=WORK, capture_output=True, text=True)
    text = out.stdout + out.stderr
    (WORK / f"{name}.schemathesis.log").write_text(text)
    summary = [l for l in text.splitlines() if "generated" in l or "passed" in l.lower() and "failed" in l.lower()]
    print(f"   schemathesis {name}: exit {out.returncode} in {time.monotonic() - started:.0f}s; {summary[-1].strip() if summary else ''}")
    if out.returncode != 0:
        print(text[-20000:])
        raise SystemExit(f"schemathesis found failures in the {name} API (log: {WORK / (name + '.schemathesis.log')})")


def main():
    WORK.mkdir(parents=True, exist_ok=True)
    specs = {}
    for name, patch in (("broker", patch_broker), ("admin", patch_admin), ("stats", patch_stats)):
        spec = yaml.safe_load((SPECS / f"anypoint-mq-{name}.yaml").read_text())
        patch(spec)
        (WORK / f"{name}.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
        specs[name] = spec
    print("== deviations from the specifications (applied to the copies in target/anypoint-contract/):")
    for d in DEVIATIONS:
        print(f"   - {d}")
    with tempfile.TemporaryDirectory() as tmp:
        proc, base = start_server(tmp)
        try:
            print(f"== scripted session against {base}")
            n = session(
                base,
                Checker("broker", specs["broker"], base),
                Checker("admin", specs["admin"], base, optional_keys=("deadLetterQueueId", "maxDeliveries", "fallbackConfig", "deadLetterSources", "routingRules", "encrypted", "queueId", "exchangeId", "defaultTtl", "defaultLockTtl", "defaultDeliveryDelay", "isFallback", "value")),
                Checker("stats", specs["stats"], base),
            )
            print(f"   {n} answers matched their operations' specifications")
            token = requests.post(base + "/api/v1/authorize", data={"client_id": "st", "client_secret": "x", "grant_type": "client_credentials"}, timeout=30).json()["access_token"]
            h = {"Authorization": f"bearer {token}"}
            a = f"{base}/mq/admin/api/v1/organizations/{ORG}/environments/{ENV}/regions/{REGION}"
            for queue in ("contract-q", "contract-admin-q"):
                requests.put(f"{a}/destinations/queues/{queue}", json={}, headers=h, timeout=30).raise_for_status()
            requests.put(f"{a}/destinations/exchanges/contract-x", json={}, headers=h, timeout=30).raise_for_status()
            print("== schemathesis")
            schemathesis(
                "broker", WORK / "broker.yaml", base + "/api/v1", token,
                "^/(authorize|organizations/.*/messages.*)$",
            )
            # Every operation, the ones answering 501 included.
            schemathesis("admin", WORK / "admin.yaml", base + "/mq/admin/api", token, "^/.*$")
            schemathesis("stats", WORK / "stats.yaml", base + "/mq/stats/api/v1", token, "^/.*$")
        finally:
            proc.terminate()
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise SystemExit("the server did not stop within 30 s of SIGTERM")
        assert code == 0, f"server exited with {code}"
    print("PASS: anypoint contract")


if __name__ == "__main__":
    main()
