"""Hostile input over HTTP against the real server processes of `make run` (gunicorn web, the stage workers, beat
and the demo CRM receiver, started from scripts/run.py's own commands; not Django's test client).

Hypothesis generates each request: the method, the path (real account and channel, unknown ones, path-like and
percent-encoded segments, a request line over the limit), the headers (a canonical, padded, empty, control-character,
non-UTF-8 or 100,000-character Idempotency-Key; a valid, stale, forged or missing signature; odd content types;
raw CR/LF injected into a header) and the body (a valid delivery; one with any field replaced by an oversize
string, a path-like or percent-encoded id, control characters, a 5,000-digit number, NaN, null, a list or an
object; JSON nested 100,000 deep; bytes that are not JSON; a body over the upload limit). The requests are sent
byte for byte over a socket, so nothing is normalized on the way. For every request:

- no 5xx, and every refusal answers the JSON error catalog (`{"code", "detail"}`, a code of
  connector.api.exceptions.API_ERROR_CODES whose catalog status is the response status);
- a refusal persists nothing (no Receipt, no idempotency key), a duplicate 200 nothing new, a 201 one Receipt;
- every 201 settles within 30 s of its admission: each event reaches an ApplicationResult, is superseded by the
  ordering contract, or waits on the quarantine board with a closed reason (tests/hostile/settled.py);
- the demo CRM receiver never sees a path outside the outbound binding's templates.

The suite sends HOSTILE_REQUESTS requests (default 600: about 30 s); `make hostile` sends 10,000. The client
keeps at most a few admitted deliveries outstanding (it waits for the oldest to settle before sending another
valid one): the promise under test is that each accepted delivery completes, not the machine's capacity, which the
benchmarks measure (docs/benchmarks.md)."""
from __future__ import annotations

import json
import os
import re
import socket
import time
from collections import Counter, deque
from dataclasses import dataclass, field

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from connector.api.exceptions import API_ERROR_CODES
from connector.models import CredentialGeneration, Receipt, ReceiptAdmissionKey
from connector.secrets import secret_backend
from connector.services.signatures import sign
from tests.hostile.settled import receipt_outcome
from tests.support import scaled

pytestmark = [pytest.mark.django_db(transaction=True, databases=["default", "journal"])]

REQUESTS = int(os.environ.get("HOSTILE_REQUESTS", "600"))
SETTLE_SECONDS = 30.0
OUTSTANDING = 4  # admitted deliveries the client lets run ahead of their settlement
CHANNEL = "records.webhook"
# The demo outbound binding's templates (connector/demo.py): create by external key, update by remote identity.
RECEIVER_PATH = re.compile(r"^/v1/records/(by-id/)?(?!\.\.?$)[^/?#]+$")

@dataclass(frozen=True)
class Raw:
    """A JSON number token written as is (Python's int would refuse 4,300+ digits; json.dumps has no 1e999)."""

    token: bytes


def dumps(document) -> bytes:
    """JSON text of `document`, with each Raw value replaced by its token."""
    raws: list[bytes] = []

    def default(value):
        if isinstance(value, Raw):
            raws.append(value.token)
            return f"@@raw{len(raws) - 1}@@"
        raise TypeError(value)

    text = json.dumps(document, allow_nan=True, default=default).encode()
    for i, token in enumerate(raws):
        text = text.replace(f'"@@raw{i}@@"'.encode(), token)
    return text


HOSTILE_TEXT = st.one_of(
    st.text(max_size=24),  # any code points: controls, format characters, surrogates excluded by JSON
    st.sampled_from(["inj/../../admin?x=1#f", "../admin", "a/b", "a%2Fb", "%2e%2e", "..", ".", "", " padded ",
                     "\x00", "a\r\nX-Injected: 1", "\u202eevil", "é", "e\u0301", "?q=1", "#frag", "a b", "~"]),
    st.integers(60, 70_000).map(lambda n: "x" * n),  # over every column's length, up to the 64 KiB of a JSON value
    st.from_regex(r"[a-z0-9/%?#.\-]{1,40}", fullmatch=True),
)
HOSTILE_VALUE = st.one_of(
    HOSTILE_TEXT,
    st.integers(min_value=-(10**20), max_value=10**20),
    st.builds(lambda digits: Raw(b"9" * digits), st.integers(19, 5000)),  # numbers of up to 5,000 digits
    st.sampled_from([Raw(b"1e999"), Raw(b"-1e999"), Raw(b"1.5e-400"), Raw(b"-0"), Raw(b"1" + b"0" * 400 + b".5")]),
    st.floats(allow_nan=True, allow_infinity=True),  # NaN and Infinity are not JSON
    st.none(), st.booleans(),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)
FIELDS = ("id", "type", "record_id", "sequence", "occurred_at", "data", "data.name", "data.email", "extra")


@dataclass
class Sent:
    """What the generated request is, so the expectation is known without a model of the server."""

    method: str
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    valid: bool  # a well-formed, signed, keyed delivery to the real account and channel: expected 201 or 200
    refuse: str = ""  # why this request must be refused whatever its body (a non-canonical key, a bad signature)


@dataclass
class Ledger:
    statuses: Counter = field(default_factory=Counter)
    codes: Counter = field(default_factory=Counter)
    outstanding: deque = field(default_factory=deque)  # (receipt id, admitted at)
    settled: Counter = field(default_factory=Counter)
    latencies: list = field(default_factory=list)
    keys: list = field(default_factory=list)  # (key, body) of earlier valid deliveries, for duplicates


def _event(n: int, record: str, sequence: int) -> dict:
    return {"id": f"hx-ev-{n}", "type": "record.updated", "record_id": record, "sequence": sequence,
            "occurred_at": "2026-12-04T10:00:00Z", "data": {"name": f"Hostile {n}", "email": f"h{n}@example.com"}}


def _replace(event: dict, path: str, value) -> dict:
    event = {**event, "data": dict(event["data"])}
    if path.startswith("data."):
        event["data"][path[5:]] = value
    else:
        event[path] = value
    return event


@st.composite
def requests_(draw, world: dict, counter: list, ledger: Ledger) -> Sent:
    counter[0] += 1
    n = counter[0]
    account, secret = world["account"], world["secret"]
    # -- the body
    body_kind = draw(st.sampled_from(["valid"] * 5 + ["field"] * 6 + ["deep", "bytes", "shape", "huge", "duplicate"]))
    # Draws depend on earlier draws only (never on the ledger): Hypothesis replays and shrinks them.
    record = draw(st.integers(0, 5))
    # mostly increasing per record (applied), sometimes any position (superseded below the high-water)
    sequence = n if draw(st.integers(0, 3)) else draw(st.integers(1, 10**6))
    pick, same = (draw(st.integers(0, 10**6)), draw(st.booleans())) if body_kind == "duplicate" else (0, True)
    if body_kind == "duplicate" and ledger.keys:
        key, body = ledger.keys[pick % len(ledger.keys)]
        body = body if same else body + b" "
    else:
        key = f"hx-key-{n}"
        event = _event(n, f"r-{record}", sequence)
        if body_kind == "field":
            event = _replace(event, draw(st.sampled_from(FIELDS)), draw(HOSTILE_VALUE))
            body = dumps({"events": [event]})
        elif body_kind == "deep":
            depth = draw(st.sampled_from([64, 1_000, 100_000]))
            body = draw(st.sampled_from([b"[" * depth + b"]" * depth,
                                         b'{"events": ' + b"[" * depth + b"]" * depth + b"}"]))
        elif body_kind == "bytes":
            body = draw(st.binary(max_size=64))
        elif body_kind == "shape":
            body = json.dumps(draw(st.one_of(
                st.just({}), st.just({"events": []}), st.just({"events": None}), st.just([event]),
                st.just({"events": [event] * 3}), st.just({"events": [event], "extra": 1}),
                st.lists(st.just(event), max_size=2).map(lambda evs: {"events": evs, "events2": evs})))).encode()
        elif body_kind == "huge":
            body = b'{"events": [], "pad": "' + b"x" * draw(st.sampled_from([3_000_000, 200_000])) + b'"}'
        else:
            body = json.dumps({"events": [event]}).encode()
    # -- the headers
    key_kind = draw(st.sampled_from(["canonical"] * 8 + ["padded", "empty", "control", "latin1", "long", "huge",
                                                           "missing", "crlf"]))
    raw_key = {"canonical": key.encode(), "padded": f" {key} ".encode(), "empty": b"",
               "control": f"{key}\x07".encode(), "latin1": key.encode() + b"\xe9\xff", "long": b"k" * 256,
               "huge": b"k" * 100_000, "missing": None, "crlf": key.encode() + b"\r\nX-Injected: 1"}[key_kind]
    sig_kind = draw(st.sampled_from(["valid"] * 8 + ["stale", "forged", "missing", "garbage"]))
    now = int(time.time())
    signature = {"valid": sign(secret, now, body), "stale": sign(secret, now - 3600, body),
                 "forged": sign(b"not-the-secret", now, body), "missing": None,
                 "garbage": draw(st.text(max_size=40))}[sig_kind]
    headers = [(b"Content-Type", draw(st.sampled_from([b"application/json"] * 4 + [b"text/plain", b"",
                                                                                    b"multipart/form-data"])))]
    if raw_key is not None:
        headers.append((b"Idempotency-Key", raw_key))
    if signature is not None:
        headers.append((b"Connector-Signature", signature.encode("utf-8", "surrogatepass")))
    # -- the target
    target_kind = draw(st.sampled_from(["real"] * 12 + ["account", "channel", "encoded", "long", "method"]))
    method, acct, chan = "POST", account, CHANNEL
    if target_kind == "account":
        acct = draw(st.sampled_from(["nobody", "..", "%2E%2E", account + "%2F..", "a" * 300, account.upper()]))
    elif target_kind == "channel":
        chan = draw(st.sampled_from(["records.other", "..%2Fadmin", "records.webhook%00", "records.webhook%2F"]))
    elif target_kind == "method":
        method = draw(st.sampled_from(["GET", "PUT", "DELETE", "PATCH", "OPTIONS"]))
    target = f"/api/v2/accounts/{acct}/channels/{chan}/receipts".encode()
    if target_kind == "encoded":
        target = f"/api/v2/accounts/{account}/channels/{CHANNEL}/receipts%2F..%2F..%2Fadmin".encode()
    elif target_kind == "long":
        target += b"?" + b"q" * 9000
    valid = (body_kind in ("valid", "duplicate") and key_kind == "canonical" and sig_kind == "valid"
             and target_kind == "real" and headers[0][1] == b"application/json")
    if valid and body_kind == "valid":
        ledger.keys.append((key, body))
    refuse = ""
    if key_kind not in ("canonical", "crlf"):  # a CR LF only splits off a header: the key before it is canonical
        refuse = f"{key_kind} Idempotency-Key"
    elif sig_kind != "valid":
        refuse = f"{sig_kind} signature"
    elif target_kind not in ("real", "method"):
        refuse = f"{target_kind} target"
    return Sent(method, target, headers, body, valid, refuse)


def send(port: int, sent: Sent) -> tuple[int, dict[str, str], bytes]:
    """One request, byte for byte, on its own connection (Connection: close)."""
    head = [f"{sent.method} ".encode() + sent.target + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close",
            f"Content-Length: {len(sent.body)}".encode()]
    head += [name + b": " + value for name, value in sent.headers]
    data = b"\r\n".join(head) + b"\r\n\r\n" + sent.body
    with socket.create_connection(("127.0.0.1", port), timeout=scaled(60)) as sock:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server refused before reading the whole body: its answer is still there
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    raw = b"".join(chunks)
    assert raw, f"no response at all to {sent.method} {sent.target[:120]!r}"
    head_bytes, _, body = raw.partition(b"\r\n\r\n")
    lines = head_bytes.split(b"\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers[name.decode("latin-1").strip().lower()] = value.decode("latin-1").strip()
    return status, headers, body


def counts() -> tuple[int, int]:
    return Receipt.objects.count(), ReceiptAdmissionKey.objects.count()


def settle(ledger: Ledger, *, keep: int) -> None:
    """Wait until at most `keep` admitted deliveries are unsettled; each must settle within SETTLE_SECONDS."""
    while len(ledger.outstanding) > keep:
        receipt_id, admitted = ledger.outstanding[0]
        outcome = receipt_outcome(receipt_id)
        if outcome is not None:
            ledger.outstanding.popleft()
            ledger.settled[outcome.split(":")[0] if outcome.startswith("applied") else outcome] += 1
            ledger.latencies.append(time.monotonic() - admitted)
            continue
        waited = time.monotonic() - admitted
        assert waited < scaled(SETTLE_SECONDS), (
            f"receipt {receipt_id} admitted {waited:.1f}s ago neither reached an ApplicationResult nor waits on "
            f"the quarantine board with a reason")
        time.sleep(0.05)


def test_generated_hostile_requests_over_http_never_5xx_persist_nothing_when_refused_and_every_201_settles(
        product):
    """Proves: CV2-05-003, CV2-05-012, CV2-09-001, CV2-13-001 (issue 15: no 5xx for any input; every
    refusal a catalog code with nothing persisted; every 201 settles within 30 s; no outbound path outside the
    binding's templates)."""
    from connector.demo import build_world

    world = build_world("hx-", push=True)
    account = world.accounts[0].account_key
    secret = secret_backend().read(CredentialGeneration.objects.get(
        generation_id=f"{account}.webhook-signing.g1").secret_version_ref)
    ledger = Ledger()
    counter = [0]

    @settings(max_examples=REQUESTS, deadline=None, database=None, derandomize=True,
              phases=[Phase.explicit, Phase.generate, Phase.shrink],
              suppress_health_check=list(HealthCheck))
    @given(sent=requests_({"account": account, "secret": secret}, counter, ledger))
    def one(sent: Sent):
        if sent.valid:
            settle(ledger, keep=OUTSTANDING - 1)
        before = counts()
        status, headers, body = send(product["port"], sent)
        after = counts()
        ledger.statuses[status] += 1
        assert status < 500, (status, body[:500], sent.method, sent.target[:200], sent.headers[:3])
        assert status >= 400 or not sent.refuse or sent.method == "OPTIONS", (
            f"{sent.refuse} must be refused, got {status}: {body[:300]!r}")
        if status >= 400:
            assert headers.get("content-type", "").startswith("application/json"), (status, headers, body[:300])
            error = json.loads(body)
            assert set(error) == {"code", "detail"} and error["code"] in API_ERROR_CODES, error
            assert API_ERROR_CODES[error["code"]][0] == status, (error, status)
            ledger.codes[error["code"]] += 1
            assert after == before, f"refused with {error['code']} but wrote {before} -> {after}"
            return
        if sent.method != "POST":  # OPTIONS describes the endpoint; nothing else reads or writes here
            assert status == 200 and sent.method == "OPTIONS" and after == before, (sent.method, status, body[:200])
            return
        answer = json.loads(body)
        if status == 201:
            assert after == (before[0] + 1, before[1] + 1), (before, after)
            ledger.outstanding.append((answer["receipt"], time.monotonic()))
        else:
            assert status == 200 and answer["admission"] == "duplicate" and after == before, (status, answer)

    one()
    settle(ledger, keep=0)
    crm = httpx.get(f"{product['crm']}/_demo/state", timeout=scaled(10)).json()
    paths = [r["path"] for r in crm["requests"]]
    outside = [p for p in paths if not RECEIVER_PATH.match(p)]
    assert not outside, f"the receiver saw paths outside the binding's templates: {outside[:5]}"
    print(f"\nhostile HTTP: {sum(ledger.statuses.values())} requests, statuses {dict(ledger.statuses)}, "
          f"codes {dict(ledger.codes.most_common())}, settled {dict(ledger.settled)}, "
          f"settle latency max {max(ledger.latencies, default=0):.2f}s, receiver paths {len(paths)}")
    assert sum(ledger.statuses.values()) >= REQUESTS
    assert ledger.statuses[201] > 0 and sum(ledger.codes.values()) > 0
