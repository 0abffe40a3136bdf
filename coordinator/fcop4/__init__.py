"""FCoP 4.0 ("G4") workspaces, through fcop's own Core: the kernel as the authority a G4 workspace needs.

``authority``: the trusted Profile the kernel gives fcop's Core (its evaluator and the issuer proofs it signs).
``reader``: every envelope fcop's Core validates, as plain records. ``adapter``: ingest (what fcop-mcp agents did,
T1–T3, becomes kernel commands) and projection (what the kernel decided becomes Core transitions). See docs/fcop4.md.
"""
