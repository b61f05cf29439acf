"""Outbound aggregates arrive with the outbound-effects issue; the dispatch gate lives in connector (see
docs/architecture.md, "Departures")."""
