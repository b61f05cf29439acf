"""Operator admin of the connector (package): `base` holds the shared read-only fact admin and renderers,
`foundation` registers owners, epochs, gates and audit, `inbound` registers the inbound chain, `approvals` the dual-approval requests,
`poison` the StepFailure evidence, `identity` users and roles under identity governance."""
from connector.admin import approvals, foundation, identity, inbound, poison  # noqa: F401
