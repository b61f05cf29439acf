"""Generic, provider-neutral interpreters of declarative L1 pack definitions. L0 knows only the closed shapes
below; packs supply every name, pointer and policy value."""
