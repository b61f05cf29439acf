"""One validated form per operator POST (issue 17). Every posted value is parsed here, so malformed input is a 400
with its catalog entry (FORM_INVALID, or STATE_TOKEN_INVALID for the state token), never a 500 and never
applied.

The state token is the one reusable piece a decision screen needs: a `DecisionForm` subclass declares the field
carrying the exact state the page showed (a `StateTokenField` over a `connector.statetokens` parser) and names
it in `token_field`; the view passes the cleaned token to the owning service, which compares it under its lock
and requires it. A new screen: render the token in a hidden input, declare the form, call `parse(request, Form)`
inside a `@screen` view (the decorator answers a refusal with the 400 page).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from connector import statetokens
from connector.errors import ConnectorError, FormInvalid, StateTokenInvalid
from connector.selectors.rows import ApprovalKind
from effects.services.dispatch import RECONCILE_DECISIONS


class FormRefused(Exception):
    """A POST whose form did not validate; `error` is the catalog error the 400 page shows."""

    def __init__(self, error: ConnectorError, fields: dict[str, list[str]]):
        super().__init__(error.detail)
        self.error = error
        self.fields = fields


class StateTokenField(forms.Field):
    """A required state token parsed by one `connector.statetokens` function (the same parser the admin uses)."""

    def __init__(self, parser: Callable[[Any], Any], **kwargs):
        self.parser = parser
        super().__init__(required=True, **kwargs)

    def clean(self, value):
        try:
            return self.parser(value)
        except StateTokenInvalid as error:
            raise ValidationError(error.detail, code="state_token") from None


class DecisionForm(forms.Form):
    """Base of every operator form. `token_field` names the field carrying the state token ("" for a form that
    only opens something, e.g. a dual-approval request)."""

    token_field = ""

    def refusal(self) -> FormRefused:
        fields = {name: [str(m) for m in messages] for name, messages in self.errors.items()}
        summary = "; ".join(f"{name}: {' '.join(messages)}" for name, messages in fields.items())
        if self.token_field and self.token_field in self.errors:
            return FormRefused(StateTokenInvalid(f"refused, nothing was applied: {summary}"), fields)
        return FormRefused(FormInvalid(f"refused, nothing was applied: {summary}"), fields)


def parse(request, form_class: type[DecisionForm], **kwargs) -> dict[str, Any]:
    """The POST's cleaned values, or FormRefused (answered 400 by the `screen` decorator)."""
    form = form_class(request.POST, **kwargs)
    if not form.is_valid():
        raise form.refusal()
    return form.cleaned_data


def _text(required: bool = True, max_length: int = 2000) -> forms.CharField:
    return forms.CharField(required=required, max_length=max_length, strip=True)


class EffectDecisionForm(DecisionForm):
    token_field = "changed_at"
    changed_at = StateTokenField(statetokens.timestamp)
    decision = forms.ChoiceField(choices=[(d, d) for d in RECONCILE_DECISIONS])
    reason = _text()
    evidence_ref = _text(max_length=500)
    remote_id = _text(required=False, max_length=255)


class DeliveryDecisionForm(DecisionForm):
    token_field = "revision"
    revision = StateTokenField(statetokens.integer)
    target = _text(max_length=64)
    reconciliation_id = _text(max_length=255)
    reason = _text()
    proof = forms.JSONField(required=False)


class DigestApprovalForm(DecisionForm):
    """One approval of a subject digest (dual approvals and receiver certifications)."""

    token_field = "digest"
    digest = StateTokenField(statetokens.digest)


class ApprovalRefusalForm(DecisionForm):
    """A refusal of a dual-approval request: the digest of the request the page showed and the refuser's reason
    (blank is the service's APPROVAL_REASON_MISSING, answered on the page with what was typed kept)."""

    token_field = "digest"
    digest = StateTokenField(statetokens.digest)
    reason = _text(required=False)


class ApprovalRequestForm(DecisionForm):
    """A dual-approval request: the subject, with the requester's reason and evidence reference (blank ones are
    the service's APPROVAL_REASON_MISSING)."""

    kind = forms.ChoiceField(choices=ApprovalKind.choices)
    subject_key = _text(max_length=255)
    reason = _text(required=False)
    evidence_ref = _text(required=False, max_length=500)


class SuccessionActionForm(DecisionForm):
    token_field = "fence"
    state = StateTokenField(statetokens.text)
    fence = StateTokenField(statetokens.integer)
    action = _text(max_length=32)
    reason = _text(required=False)

    def refusal(self) -> FormRefused:
        refusal = super().refusal()
        if "state" in self.errors and not isinstance(refusal.error, StateTokenInvalid):
            return FormRefused(StateTokenInvalid(refusal.error.detail), refusal.fields)
        return refusal


class AttemptActionForm(DecisionForm):
    token_field = "token"
    token = StateTokenField(lambda raw: statetokens.digest(raw, nbytes=16, what="attempt state token"))
    action = _text(max_length=32)
    reason = _text(required=False)
    effect = _text(required=False, max_length=255)
    outcome = forms.ChoiceField(required=False, choices=[("", ""), ("remote_finalized", "remote_finalized"),
                                                         ("no_effect", "no_effect")])
    evidence = _text(required=False, max_length=10000)
