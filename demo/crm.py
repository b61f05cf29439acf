"""The demo remote system of `make run` (`python -m demo.receiver`): a small CRM on loopback that models create and
update the way a CRM does, so the README's walkthrough holds for every update of a record (D-190).

  POST  /v1/records/<external key>   create, or update the record that already has this external key (upsert by
                                      external id); 201 {"id"} on create, 200 {"id"} on update
  PATCH /v1/records/by-id/<id>        update the record with this CRM id; a merged record answers with the id it
                                      was merged into (a real identity change); 404 for an unknown id
  POST  /bulk...                      the REST bulk delivery receiver protocol (sync_batch)
  GET   /_demo/state                  the CRM's records and every request it answered, with the fields it carried
                                      (for demos and tests)
  POST  /_demo/merge/<id>             merge the record into a new id, as a CRM's duplicate merge does (forces the
                                      identity conflict the operator then resolves)

Every mutation is applied once per Idempotency-Key: a repeat gets the first answer again (status 200) and
changes nothing.

The CRM remembers across restarts when it is given a journal file (`DemoCrm(journal=path)`; `python -m demo.receiver`
keeps one under .data/, D-440), as a real receiver would: every change (the records it touched, its id sequence, the
Idempotency-Key's answer, the request) is appended as one JSON line and flushed before the answer is sent, and a
restart replays the file. So ids continue where they stopped (never `crm-1` twice) and a repeat of a key answered
before the restart still gets its first answer. A last line torn by a kill is ignored (its request was never
answered). Without a journal the CRM lives in memory only (the tests' in-process receivers).
"""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

RECORDS = "/v1/records/"
BY_ID = "/v1/records/by-id/"


class DemoCrm:
    def __init__(self, write=None, journal: str | Path | None = None) -> None:
        self.records: dict[str, dict] = {}  # CRM id -> {external_key, version, fields, merged_into}
        self.by_key: dict[str, str] = {}  # external key -> CRM id
        self.answers: dict[str, tuple[int, dict]] = {}  # Idempotency-Key -> first answer
        self.requests: list[dict] = []
        self.batches: dict[str, int] = {}
        self.lock = threading.Lock()
        self.serial = 0
        self.write = write or (lambda line: None)
        self.journal = None
        if journal is not None:
            self._replay(Path(journal))
            self.journal = Path(journal).open("a", encoding="utf-8")

    # -- the journal (D-440) ------------------------------------------------------------------------------------

    def _replay(self, path: Path) -> None:
        """Apply every complete line of the journal; cut a torn last line off (its request was never answered)."""
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            return
        raw = path.read_bytes()
        good = 0
        for line in raw.splitlines(keepends=True):
            try:
                entry = json.loads(line)
            except ValueError:
                break
            if not line.endswith(b"\n"):
                break
            self._apply(entry)
            good += len(line)
        if good < len(raw):
            with path.open("r+b") as handle:
                handle.truncate(good)
        if self.records:
            count = len(self.records)
            self.write(f"demo CRM remembers {count} record{'' if count == 1 else 's'} from {path} "
                       f"(next id crm-{self.serial + 1})")

    def _apply(self, entry: dict) -> None:
        self.serial = max(self.serial, entry.get("serial", 0))
        for crm_id, record in entry.get("records", {}).items():
            self.records[crm_id] = record
            if not record["merged_into"]:
                self.by_key[record["external_key"]] = crm_id
        if entry.get("key"):
            status, answer = entry["answer"]
            self.answers[entry["key"]] = (status, answer)
        if entry.get("batch"):
            self.batches.setdefault(entry["batch"], entry["count"])
        if entry.get("request"):
            self.requests.append(entry["request"])

    def _remember(self, **entry) -> None:
        """Append one change to the journal (under the lock, before the answer is sent)."""
        if self.journal is not None:
            self.journal.write(json.dumps({"serial": self.serial, **entry}, sort_keys=True) + "\n")
            self.journal.flush()

    # -- the CRM ------------------------------------------------------------------------------------------------

    def _new_id(self) -> str:
        self.serial += 1
        return f"crm-{self.serial}"

    def _surviving(self, crm_id: str) -> str | None:
        seen = set()
        while crm_id in self.records and self.records[crm_id]["merged_into"] and crm_id not in seen:
            seen.add(crm_id)
            crm_id = self.records[crm_id]["merged_into"]
        return crm_id if crm_id in self.records else None

    def upsert(self, external_key: str, fields: dict) -> tuple[int, dict]:
        crm_id = self._surviving(self.by_key.get(external_key, ""))
        if crm_id is None:
            crm_id = self._new_id()
            self.records[crm_id] = {"external_key": external_key, "version": 1, "fields": fields,
                                    "merged_into": ""}
            self.by_key[external_key] = crm_id
            return 201, {"id": crm_id}
        record = self.records[crm_id]
        record["fields"] = {**record["fields"], **fields}
        record["version"] += 1
        return 200, {"id": crm_id}

    def update(self, crm_id: str, fields: dict) -> tuple[int, dict]:
        surviving = self._surviving(crm_id)
        if surviving is None:
            return 404, {"error": f"no record {crm_id}"}
        record = self.records[surviving]
        record["fields"] = {**record["fields"], **fields}
        record["version"] += 1
        return 200, {"id": surviving}

    def merge(self, crm_id: str) -> tuple[int, dict]:
        with self.lock:
            surviving = self._surviving(crm_id)
            if surviving is None:
                return 404, {"error": f"no record {crm_id}"}
            new_id = self._new_id()
            old = self.records[surviving]
            self.records[new_id] = {**old, "merged_into": ""}
            old["merged_into"] = new_id
            self.by_key[old["external_key"]] = new_id
            self._remember(records={surviving: old, new_id: self.records[new_id]})
        self.write(f"merged {surviving} into {new_id}")
        return 200, {"id": new_id}

    def mutate(self, method: str, path: str, key: str, body: bytes) -> tuple[int, dict]:
        try:
            data = json.loads(body or b"{}")
            fields = {k: v for k, v in data.items() if k != "record_key"} if isinstance(data, dict) else None
        except ValueError:
            fields = None
        key = key or hashlib.sha256(method.encode() + path.encode() + body).hexdigest()
        with self.lock:
            if key in self.answers:
                status, answer = 200, self.answers[key][1]
                kind = "repeat"
            elif fields is None:
                status, answer, kind = 400, {"error": "not a JSON object"}, "refused"
            elif method == "PATCH" and path.startswith(BY_ID) and path.count("/") == 4:
                status, answer = self.update(unquote(path[len(BY_ID):]), fields)
                kind = "updated" if status == 200 else "refused"
            elif method in ("POST", "PUT") and path.startswith(RECORDS) and path.count("/") == 3:
                status, answer = self.upsert(unquote(path[len(RECORDS):]), fields)
                kind = "created" if status == 201 else "updated"
            else:
                status, answer, kind = 404, {"error": f"no route {method} {path}"}, "refused"
            request = {"method": method, "path": path, "key": key, "status": status, "kind": kind,
                       "id": answer.get("id", ""), "fields": fields or {}}
            self.requests.append(request)
            if kind in ("created", "updated"):
                self.answers[key] = (status, answer)
                self._remember(records={answer["id"]: self.records[answer["id"]]}, key=key, answer=[status, answer],
                               request=request)
            else:
                self._remember(request=request)
        self.write(f"{kind} {method} {path} key={key[:16]}... -> {answer.get('id', answer.get('error'))}")
        return status, answer

    def bulk(self, key: str, body: bytes) -> tuple[int, dict]:
        """The delivery receiver protocol (sync_batch): apply the batch once per receiver mutation key and
        answer the applied count with the payload digest (effects/delivery/protocol.py)."""
        try:
            records = json.loads(body).get("records", [])
        except (ValueError, AttributeError):
            return 400, {"error": "not json"}
        with self.lock:
            first = key not in self.batches
            self.batches.setdefault(key, len(records))
            if first:
                self._remember(batch=key, count=len(records))
        self.write(f"{'applied' if first else 'repeat'} bulk batch of {len(records)} records key={key[:16]}...")
        return 200, {"status": "succeeded", "applied": len(records), "payload_sha256": hashlib.sha256(body).hexdigest()}

    def state(self) -> dict:
        with self.lock:
            return {"records": [{"id": crm_id, **record} for crm_id, record in sorted(self.records.items())],
                    "requests": list(self.requests)}

    # -- HTTP ---------------------------------------------------------------------------------------------------

    def server(self, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
        crm = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))

            def do_POST(self):  # noqa: N802
                body = self._body()
                if self.path.startswith("/bulk"):
                    return self._answer(*crm.bulk(self.headers.get("Idempotency-Key", ""), body))
                if self.path.startswith("/_demo/merge/"):
                    return self._answer(*crm.merge(unquote(self.path[len("/_demo/merge/"):])))
                return self._answer(*crm.mutate(self.command, self.path, self.headers.get("Idempotency-Key", ""),
                                                body))

            def do_PATCH(self):  # noqa: N802
                return self._answer(*crm.mutate("PATCH", self.path, self.headers.get("Idempotency-Key", ""),
                                                self._body()))

            do_PUT = do_POST

            def do_GET(self):  # noqa: N802
                if self.path == "/_demo/state":
                    return self._answer(200, crm.state())
                return self._answer(404, {"error": "not found"})

        server = ThreadingHTTPServer((host, port), Handler)
        server.daemon_threads = True
        return server
