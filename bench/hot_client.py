"""A hot-account client process: bootstrapped once, it runs the commands it is sent (warm-up, the mix, a
control transition, admission only, batch receipts, the baselines, or a named function of another bench)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
import traceback
from collections.abc import Callable

from bench.hot_raw import _cmd_peer, _cmd_raw
from bench.hot_recorder import RECORDER, REJECTION_BACKOFF_SECONDS, REPLAY_EVERY, _install_timers, _sleep_until


# =================================================================================================================
# bench processes
# =================================================================================================================

def _bootstrap(setup: dict) -> None:
    """Django in a spawned bench process: the throwaway databases, the secret directory and egress URL of the
    parent, quiet logs, the timers."""
    os.environ["DJANGO_SETTINGS_MODULE"] = setup["settings_module"]
    os.environ["CONNECTOR_EGRESS_BASE_URL"] = setup["connector"]["EGRESS_BASE_URL"]
    import django

    django.setup()
    from django.conf import settings
    from django.db import connections

    settings.DEBUG = False
    for alias, name in setup["names"].items():
        connections[alias].settings_dict["NAME"] = name
    settings.CONNECTOR = {**settings.CONNECTOR, **setup["connector"]}
    for name in ("connector", "effects", "cutover", "procrastinate", "httpx", "httpcore", "django.db.backends"):
        logging.getLogger(name).setLevel(logging.WARNING)
    _install_timers()


def process_setup(egress_url: str) -> dict:
    """What a spawned bench process needs from its parent (`_bootstrap`): the settings module, the databases the
    parent's connections point at, the secret directory and the egress URL of the loopback receiver."""
    from django.conf import settings
    from django.db import connections

    return {"settings_module": os.environ.get("DJANGO_SETTINGS_MODULE") or settings.SETTINGS_MODULE,
            "names": {alias: connections[alias].settings_dict["NAME"] for alias in ("default", "journal")},
            "connector": {"EGRESS_BASE_URL": egress_url,
                          "SECRET_BACKEND_DIR": settings.CONNECTOR["SECRET_BACKEND_DIR"],
                          "EGRESS_TIMEOUT_SECONDS": settings.CONNECTOR.get("EGRESS_TIMEOUT_SECONDS", 5)}}


def _process_main(index: int, setup: dict, inbox, outbox) -> None:
    """A bench process: bootstrap once, then run each command from `inbox` and put its result on `outbox`."""
    try:
        _bootstrap(setup)
        outbox.put(("ready", index, None))
    except BaseException:  # noqa: BLE001
        outbox.put(("failed", index, traceback.format_exc()))
        return
    while True:
        command = inbox.get()
        if command is None:
            break
        try:
            handlers = {"warm": _cmd_warm, "mix": _cmd_mix, "control": _cmd_control, "admission": _cmd_admission,
                        "batch": _cmd_batch, "raw": _cmd_raw, "peer": _cmd_peer}
            # "call": a command of another bench module run in this pool ("module:function", e.g. bench.overhead)
            handler = handlers.get(command["kind"]) or _imported(command["target"])
            outbox.put(("result", index, handler(index, command)))
        except BaseException:  # noqa: BLE001
            outbox.put(("failed", index, traceback.format_exc()))
        finally:
            from django.db import connections

            connections.close_all()


def _imported(target: str) -> Callable[[int, dict], dict]:
    import importlib

    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


class Client:
    """One client process's loop over the complete mix against one account."""

    def __init__(self, index: int, command: dict) -> None:
        from connector.actors import Actor
        from connector.models import AccountServingGate
        from effects.services import dispatch

        self.index = index
        self.account_id = command["account_id"]
        self.account_key = command["account_key"]
        self.tag = f"{command['tag']}-c{index}"
        self.actor = Actor.system("bench-hot-account")
        self.holder = dispatch.holder_register(holder_id=f"bench-{self.tag}-{os.getpid()}")
        gate = AccountServingGate.objects.select_related("epoch").get(account_id=self.account_id)
        self.epoch_id, self.epoch_digest = gate.epoch.epoch_id, bytes(gate.epoch.digest)
        self.pending_materialize: list[tuple[str, int]] = []
        self.pending_lanes: list[int] = []
        self.pending_tokens: list = []
        self.pending_claims: list = []
        self.rounds = 0
        self.replay_every = int(command.get("replay_every") or REPLAY_EVERY)

    # -- helpers ---------------------------------------------------------------------------------------------
    def _gate_serving(self) -> bool:
        from connector.models import AccountServingGate

        mode = AccountServingGate.objects.filter(account_id=self.account_id).values_list("mode", flat=True).first()
        return mode == "v2_serving"

    def _empty_or_rejected(self, cls: str) -> str:
        """A claim that found nothing: an availability rejection if the gate was not serving, else empty."""
        if self._gate_serving():
            RECORDER.reclassify_last(cls, "empty", "")
            return "empty"
        RECORDER.reclassify_last(cls, "rejected", "GateNotServing(claim skipped)")
        return "rejected"

    # -- the chain -------------------------------------------------------------------------------------------
    def materialize(self, receipt_pk: int, cls: str = "materialization") -> str:
        from connector import tracing
        from connector.models import ReceiptTrace
        from connector.services.materialize import receipt_materialize

        # As the materialize task's entry point does: a span continuing the receipt's stored trace (tracing off: a
        # shared no-op; `bench overhead` turns it on).
        with tracing.stage("receipt_materialize", ReceiptTrace, receipt_id=receipt_pk):
            outcome, out = RECORDER.op(cls, lambda: receipt_materialize(receipt_pk=receipt_pk,
                                                                        account_id=self.account_id))
        if outcome == "rejected":
            self.pending_materialize.append((cls, receipt_pk))
        elif outcome == "ok" and cls == "materialization":
            for lane in sorted(out.lanes):
                self.advance(lane)
        return outcome

    def advance(self, lane_pk: int) -> str:
        from connector.services.execution import lanes_advance

        # As the product's lane step does: the one path with the account the task message carries.
        outcome, minted = RECORDER.op("lane_advance", lambda: lanes_advance(lane_pks=[lane_pk],
                                                                             account_id=self.account_id))
        if outcome == "rejected":
            self.pending_lanes.append(lane_pk)
        elif outcome == "ok" and not minted:
            RECORDER.reclassify_last("lane_advance", "empty", "")
        return outcome

    def claim_and_run(self) -> str:
        from connector.services.execution import execution_claim

        outcome, token = RECORDER.op("execution_claim", lambda: execution_claim(
            holder=f"bench-{self.tag}", lease_seconds=60, account_id=self.account_id))
        if outcome == "ok" and token is None:
            return self._empty_or_rejected("execution_claim")
        if outcome != "ok":
            return outcome
        return self.run(token)

    def run(self, token) -> str:
        from connector.services.execution import execution_run

        outcome, _ = RECORDER.op("runtime_completion", lambda: execution_run(token=token))
        if outcome == "rejected":
            self.pending_tokens.append(token)
        return outcome

    def dispatch(self) -> str:
        from effects.services import dispatch

        outcome, claim = RECORDER.op("effect_claim", lambda: dispatch.effect_claim(
            holder=self.holder, lease_seconds=60, account_id=self.account_id))
        if outcome == "ok" and claim is None:
            return self._empty_or_rejected("effect_claim")
        if outcome != "ok":
            return outcome
        return self.acquire_and_send(claim)

    def acquire_and_send(self, claim) -> str:
        from effects import egress_batch
        from effects.services import dispatch

        outcome, permit = RECORDER.op("permit_acquire", lambda: dispatch.permit_acquire(claim=claim))
        if outcome == "rejected":
            self.pending_claims.append(claim)
            return outcome
        if outcome != "ok":
            return outcome
        outcome, effect = RECORDER.op("egress_send", lambda: egress_batch.send(
            permit_pk=permit.pk, holder_id=self.holder.holder_id, holder_fence=permit.holder_fence,
            credential_gate_fence=permit.credential_gate_fence))
        if outcome == "rejected":
            # A revocation fenced this granted permit out: abandon it with that proof (the effect returns to
            # `prepared` and is claimed again), so the open-permit set drains and the halt can complete.
            RECORDER.op("permit_abandon", lambda: dispatch.permit_abandon(permit_pk=permit.pk, actor=self.actor))
            return outcome
        if outcome != "ok":
            return outcome
        if effect.state == "remote_confirmed":
            slot = effect.command.path.rstrip("/").rsplit("/", 1)[-1]
            outcome, _ = RECORDER.op("effect_finalize", lambda: dispatch.effect_finalize(effect_pk=effect.pk,
                                                                                         owner_slot=slot))
        return outcome

    def replay(self, tag: str) -> str:
        from connector.models import Execution, ReceiptComponent
        from connector.services.replay import replay_request_admit

        # Untimed: the newest completed transport event of the account and its exact component bytes.
        event_id = (Execution.objects.filter(account_id=self.account_id, state="completed",
                                             projection__suppress_external_effects=False)
                    .order_by("-pk").values_list("projection__event_id", flat=True).first())
        if event_id is None:
            return "empty"
        payload = ReceiptComponent.objects.filter(event_id=event_id, disposition="event").values_list(
            "payload", flat=True).first()
        outcome, admission = RECORDER.op("replay_admission", lambda: replay_request_admit(
            account_key=self.account_key, request_id=f"bench-replay-{tag}", target_epoch_id=self.epoch_id,
            target_epoch_digest=self.epoch_digest, predecessor_event_id=event_id,
            predecessor_payload_digest=hashlib.sha256(bytes(payload)).digest(),
            reason="bench hot-account: replay of a completed event", principal="bench-hot-account",
            mode="suppress_external_effects", actor=self.actor))
        if outcome == "ok":
            if admission.outcome != "created":
                RECORDER.note("replay_admission", "race", f"resolved as {admission.outcome}")
            return self.materialize(admission.receipt.pk, "replay_materialization")
        return outcome

    def retry_pending(self) -> bool:
        """Retry work refused while the gate or the credential was unavailable. False if still refused."""
        for items, attempt in ((self.pending_materialize, lambda item: self.materialize(item[1], item[0])),
                               (self.pending_lanes, self.advance), (self.pending_tokens, self.run),
                               (self.pending_claims, self.acquire_and_send)):
            while items:
                item = items.pop(0)
                if attempt(item) == "rejected":
                    return False  # `attempt` queued the item again
        return True

    def round(self) -> None:
        from connector import tracing
        from connector.demo import DEMO_CHANNEL, demo_event_body
        from connector.services.admission import receipt_admit

        rejected = not self.retry_pending()
        tag = f"{self.tag}-{self.rounds}"
        self.rounds += 1
        with tracing.server_span("receipt_admit", {}):  # as the admission view: a new trace (off: a no-op)
            outcome, admission = RECORDER.op("transport_admission", lambda: receipt_admit(
                account_key=self.account_key, channel=DEMO_CHANNEL, transport_key=f"bench-{tag}",
                body=demo_event_body(tag), actor=self.actor))
        if outcome == "ok":
            if admission.outcome != "created":
                RECORDER.note("transport_admission", "race", f"resolved as {admission.outcome}")
            outcome = self.materialize(admission.receipt.pk)
        rejected = rejected or outcome == "rejected"
        rejected = self.claim_and_run() == "rejected" or rejected
        rejected = self.dispatch() == "rejected" or rejected
        if self.rounds % self.replay_every == 0:
            rejected = self.replay(tag) == "rejected" or rejected
        if rejected:
            time.sleep(REJECTION_BACKOFF_SECONDS)

    def drain(self, until: float) -> None:
        """Untimed: finish refused work and dispatch what this client left, so the next run starts clean."""
        saved, RECORDER.enabled = RECORDER.enabled, False
        try:
            while time.time() < until and (self.pending_materialize or self.pending_lanes or self.pending_tokens
                                           or self.pending_claims):
                if not self.retry_pending():
                    time.sleep(0.05)
        finally:
            RECORDER.enabled = saved


def _cmd_warm(index: int, command: dict) -> dict:
    """Untimed rounds (route and mapping caches, prepared connections) before the first measured run."""
    if command.get("role") == "control":
        from connector.models import AccountServingGate

        AccountServingGate.objects.filter(account_id=command["account_id"]).exists()
        return {"warm": 0}
    RECORDER.enabled = False
    try:
        client = Client(index, command)
        for _ in range(command["rounds"]):
            client.round()
        client.drain(time.time() + 10)
        return {"warm": client.rounds}
    finally:
        RECORDER.enabled = True
        RECORDER.records = []


def _cmd_mix(index: int, command: dict) -> dict:
    """The measured loop of one client. `profile` (a file name): the loop runs under cProfile, dumped there, and
    the statements it sends are counted by the innermost operation class in progress (`statements`)."""
    import cProfile

    from django.db import connection

    RECORDER.records = []
    client = Client(index, command)
    statements: dict[str, int] = {}

    def count(execute, sql, params, many, context):
        cls = RECORDER.names[-1] if RECORDER.names else "untimed"
        statements[cls] = statements.get(cls, 0) + 1
        return execute(sql, params, many, context)

    profile = cProfile.Profile(time.process_time) if command.get("profile") else None  # CPU, not wall time
    _sleep_until(command["start_at"])
    began, cpu = time.time(), time.process_time()
    with connection.execute_wrapper(count) if profile else contextlib.nullcontext():
        if profile:
            profile.enable()
        while time.time() < command["deadline"]:
            client.round()
        if profile:
            profile.disable()
            profile.dump_stats(command["profile"])
    ended, cpu = time.time(), time.process_time() - cpu
    records, RECORDER.records = RECORDER.records, []
    client.drain(ended + 15)
    return {"records": records, "rounds": client.rounds, "began": began, "ended": ended, "cpu_seconds": cpu,
            "left_pending": len(client.pending_materialize) + len(client.pending_lanes)
            + len(client.pending_tokens) + len(client.pending_claims), "statements": statements}


def _cmd_control(index: int, command: dict) -> dict:
    """Credential revocation + re-enablement at 25% of the run, a halt cycle at 55%; each held for `hold`. With
    `drills` = k > 1 the run is cut into k equal periods and each period gets both drills at 25% and 55% of it,
    so the control transitions' p99 under the mix (issue 18, goal 6) rests on k samples each."""
    from connector.actors import Actor
    from connector.errors import TransitionRefused
    from connector.services.gates import credential_gate_transition, gate_transition

    RECORDER.records = []
    actor = Actor.system("bench-hot-account-control")
    start, seconds, hold = command["start_at"], command["seconds"], command["hold"]
    account_id, generation = command["account_id"], command["credential_generation"]
    windows, problems = [], []
    result = {"windows": windows, "problems": problems, "confirm_attempts": 0, "drain_ms": None}

    def transition(cls, fn, *, expected=(), tries=50):
        for _ in range(tries):
            outcome, value = RECORDER.op(cls, fn, expected=expected)
            if outcome == "ok":
                return value
            if outcome == "blocked":
                return None
            time.sleep(0.01)
        problems.append(f"{cls} did not succeed after {tries} tries")
        return None

    drills = int(command.get("drills", 1))
    period = seconds / drills
    for k in range(drills):
        cycle = start + k * period
        _sleep_until(cycle + 0.25 * period)
        opened = time.time()
        transition("credential_revoke", lambda: credential_gate_transition(
            generation_id=generation, action="revoke", expected_fence=None, actor=actor,
            reason="bench hot-account: revocation drill"))
        time.sleep(hold)
        transition("credential_reenable", lambda: credential_gate_transition(
            generation_id=generation, action="reenable", expected_fence=None, actor=actor,
            reason="bench hot-account: explicit re-enablement after the drill"))
        windows.append(["credential", opened, time.time()])

        _sleep_until(cycle + 0.55 * period)
        opened = time.time()
        halted = transition("halt_v2", lambda: gate_transition(
            account_id=account_id, action="halt_v2", expected_fence=None, actor=actor,
            reason="bench hot-account: halt drill"))
        drain = None
        if halted is not None:
            halt_committed = time.time()
            give_up = command["deadline"] + 30
            while True:
                result["confirm_attempts"] += 1
                outcome, _ = RECORDER.op("confirm_halted", lambda: gate_transition(
                    account_id=account_id, action="confirm_halted", expected_fence=None, actor=actor,
                    reason="bench hot-account: open-permit set is empty"), expected=(TransitionRefused,))
                if outcome == "ok":
                    drain = (time.time() - halt_committed) * 1000
                    result["drain_ms"] = max(result["drain_ms"] or 0.0, drain)  # the longest drain of the run
                    break
                if time.time() > give_up:
                    problems.append(f"confirm_halted still refused after {result['confirm_attempts']} attempts")
                    break
                time.sleep(0.01)
            if drain is not None:
                time.sleep(hold)
                transition("resume_predecessor", lambda: gate_transition(
                    account_id=account_id, action="resume_predecessor", expected_fence=None, actor=actor,
                    reason="bench hot-account: resume after the drill"))
        windows.append(["halt", opened, time.time()])
    records, RECORDER.records = RECORDER.records, []
    result["records"] = records
    return result


def _cmd_admission(index: int, command: dict) -> dict:
    """Product admission only (receipt_admit with fresh keys), for the comparison with the raw baseline."""
    from connector.actors import Actor
    from connector.demo import DEMO_CHANNEL, demo_event_body
    from connector.services.admission import receipt_admit

    actor = Actor.system("bench-hot-account")
    latencies, failures, n = [], 0, 0
    tag = f"{command['tag']}-a{index}"
    _sleep_until(command["start_at"])
    while time.time() < command["deadline"]:
        key = f"{tag}-{n}"
        n += 1
        began = time.perf_counter()
        try:
            receipt_admit(account_key=command["account_key"], channel=DEMO_CHANNEL, transport_key=f"bench-{key}",
                          body=demo_event_body(key), actor=actor)
        except Exception:  # noqa: BLE001
            failures += 1
            continue
        latencies.append((time.perf_counter() - began) * 1000)
    return {"latencies": latencies, "failures": failures}


BATCH_EVENTS = 100  # events per receipt of the "batch receipt" phase (issue 18, goal 2)

BATCH_GOAL_EVENTS_PER_S = 2000.0  # issue 18, goal 2: reported beside the measured figure, not the budget floor


def batch_body(tag: str, events: int) -> bytes:
    """One demo webhook delivery carrying `events` events, each for its own record (so each opens its own lane:
    the widest receipt materialization can meet)."""
    return json.dumps({"events": [
        {"id": f"bench-ev-{tag}-{i}", "type": "record.updated", "record_id": f"bench-r-{tag}-{i}", "sequence": 1,
         "occurred_at": "2025-01-01T00:00:00Z", "data": {"name": f"Bench {tag} {i}", "email": f"{tag}.{i}@example.com"}}
        for i in range(events)]}, sort_keys=True).encode()


def _cmd_batch(index: int, command: dict) -> dict:
    """Batch receipts (issue 18, goal 2): admit an N-event receipt with a fresh key and materialize it, in a
    loop; each sample is one receipt's admission + materialization time. Events per second = events admitted
    and materialized / phase seconds."""
    from connector.actors import Actor
    from connector.demo import DEMO_CHANNEL
    from connector.services.admission import receipt_admit
    from connector.services.materialize import receipt_materialize

    actor = Actor.system("bench-hot-account")
    events = int(command["events"])
    latencies, failures, n, materialized = [], 0, 0, 0
    tag = f"{command['tag']}-b{index}"
    for i in range(int(command.get("warm", 2))):  # untimed: route caches, the connection, the first lanes' pages
        receipt_materialize(receipt_pk=receipt_admit(
            account_key=command["account_key"], channel=DEMO_CHANNEL, transport_key=f"bench-{tag}-w{i}",
            body=batch_body(f"{tag}-w{i}", events), actor=actor).receipt.pk)
    began = time.time()
    deadline = began + float(command["seconds"])
    while time.time() < deadline:
        key = f"{tag}-{n}"
        body = batch_body(key, events)
        n += 1
        t0 = time.perf_counter()
        try:
            admission = receipt_admit(account_key=command["account_key"], channel=DEMO_CHANNEL,
                                      transport_key=f"bench-{key}", body=body, actor=actor)
            out = receipt_materialize(receipt_pk=admission.receipt.pk)
        except Exception:  # noqa: BLE001
            failures += 1
            continue
        latencies.append((time.perf_counter() - t0) * 1000)
        materialized += len(out.events)
    return {"latencies": latencies, "failures": failures, "events": materialized, "began": began,
            "ended": time.time()}
