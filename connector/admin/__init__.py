"""Operator admin of the connector (package): `base` holds the shared read-only fact admin and renderers,
`foundation` registers owners, epochs, gates and audit, `inbound` registers the inbound chain."""
from connector.admin import foundation, inbound  # noqa: F401
