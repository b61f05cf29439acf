"""The demo remote system of `make run`: not a product package (D-266). It holds what only the demo and the tests
talk to: a loopback CRM that serves the outbound record pushes and the REST bulk delivery receiver protocol
(crm.py), run by `python -m demo.receiver`. No product package imports it (import-linter "no product package
imports the demo"); it imports nothing of the product either, so it runs without Django."""
