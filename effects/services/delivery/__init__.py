"""REST bulk delivery services (docs/contracts/rest-bulk-delivery-design.v1.yaml): setup (bindings,
certification, profiles), planning (parent plans and generation admission), execution (submit, outcomes, polls,
verification), finalization (capacity, watermarks, promotion), reconciliation, journal (mutation gate) and runner
(driving, orphan recovery, sweep)."""
