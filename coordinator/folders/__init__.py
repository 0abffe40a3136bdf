"""The FCoP folder adapter: files in, kernel commands out (ingest); kernel events in, files out (projection).

Built on the pure file layer in `taskkernel.coordinator.fcop`. The kernel is the only lifecycle authority
(FCoP ADR-0002): files are requests and evidence, the event log is the truth, and the folders
(TASK files per `_lifecycle/` stage, the ledger and the per-role views) are its projection.
"""
