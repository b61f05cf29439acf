"""REST bulk delivery: the contract loader (contract.py), identities (identity.py), the error catalog
(errors.py), the receiver protocol (protocol.py), the watermark interval map (watermark.py) and a loopback test
receiver (receiver.py). Models live in effects/models/delivery/, services in effects/services/delivery/."""
