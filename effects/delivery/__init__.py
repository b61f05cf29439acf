"""REST bulk delivery, the contract layer: pure modules below the models (no model, service, adapter or
interface import; import-linter "the delivery contract layer is pure" holds it). The contract loader
(contract.py), identities and digests (identity.py), the error catalog (errors.py), the receiver protocol as the
egress adapter reads it (protocol.py) and the watermark interval map (watermark.py). The models layer is
effects/models/delivery/, the services layer effects/services/delivery/; the loopback receivers are test and
demo code outside the product packages (tests/effects/delivery/receiver.py, demo/). One `delivery` package per
layer (D-266)."""
