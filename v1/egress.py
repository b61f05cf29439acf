"""V1's sole provider-I/O call site (listed in v1/manifest.py). It sends only for an effect whose durable pre-I/O
marker (`dispatching`) is committed and only while its process generation is running and not egress-isolated
(reread from PostgreSQL right before the call: the environment's egress fence)."""
from __future__ import annotations

from dataclasses import dataclass

import httpx
from django.conf import settings

from v1.errors import V1GenerationRefused
from v1.models import EffectState, GenerationState, V1OutboundEffect, V1ProcessGeneration


@dataclass(frozen=True)
class Outcome:
    state: str  # finalized | no_effect | ambiguous
    remote_id: str
    evidence: str


def send(effect: V1OutboundEffect, generation_id: str) -> Outcome:
    generation = V1ProcessGeneration.objects.filter(generation_id=generation_id).first()
    if generation is None or generation.state != GenerationState.RUNNING or generation.egress_isolated:
        raise V1GenerationRefused(f"generation {generation_id} may not reach the provider")
    if effect.state != EffectState.DISPATCHING:
        raise V1GenerationRefused(f"effect {effect.request_key} has no committed pre-I/O marker")
    base = settings.CONNECTOR["EGRESS_BASE_URL"].rstrip("/")
    try:
        response = httpx.post(f"{base}/v1/records/{effect.account_key}", content=bytes(effect.request_body),
                              headers={"Idempotency-Key": effect.request_key, "Content-Type": "application/json"},
                              timeout=settings.CONNECTOR["EGRESS_TIMEOUT_SECONDS"])
    except httpx.HTTPError as exc:
        return Outcome(EffectState.AMBIGUOUS, "", f"transport error {type(exc).__name__}")
    if 200 <= response.status_code < 300:
        try:
            remote_id = str(response.json().get("id", ""))
        except ValueError:
            remote_id = ""
        return Outcome(EffectState.FINALIZED, remote_id, f"HTTP {response.status_code}")
    if response.status_code in (400, 409, 422):
        return Outcome(EffectState.NO_EFFECT, "", f"HTTP {response.status_code}: refused before applying")
    return Outcome(EffectState.AMBIGUOUS, "", f"HTTP {response.status_code}")
