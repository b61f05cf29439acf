"""The shared kernel (ARCHITECTURE.md, D-258): code every app may import that belongs to no one app's private
layers. Today: `admin` (the operator-admin base). The other kernel modules keep their historic places:
`connector.errors`, `connector.actors`, `connector.choices`, `connector.canonical`, `connector.faults`."""
