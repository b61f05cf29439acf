"""Operator admin of the connector (package): `base` holds the connector's panels and inlines on top of the shared
kernel (connector.kernel.admin), `owners` registers the owner generations, `serving` epochs, gates and credential
gates, `audit` the audit record, `inbound` the inbound chain, `approvals` the dual-approval requests, `poison` the
StepFailure evidence, `identity` users and roles under identity governance."""
from connector.admin import approvals, audit, identity, inbound, owners, poison, serving  # noqa: F401
