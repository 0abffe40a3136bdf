"""The folder adapter as the coordinator drives it: ingest, project, refresh the ledger."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from taskkernel.coordinator.fcop import Scanner, open_workspace
from taskkernel.coordinator.fcop.detect import Generation, detect_generation, find_workspace_root
from taskkernel.coordinator.folders.importer import Importer, ImportReport
from taskkernel.coordinator.folders.ingest import Ingest, IngestIncomplete, IngestStats
from taskkernel.coordinator.folders.projection import PROJECT_EFFECT, Projection
from taskkernel.coordinator.folders.tracking import FileTracker
from taskkernel.coordinator.workspace import STATE_DIR
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.outbox import OutboxRelay

if TYPE_CHECKING:
    from taskkernel.coordinator.fcop4.adapter import G4Adapter

PROJECT_BATCH = 25  # events projected per pass (about 10 ms each: a TASK file written and synced)


def open_folders(kernel: TaskCommandKernel, workspace_root: Path, *, settle_s: float = 1.0, grace_s: float = 5.0,
                 submit_on_done_report: bool = True) -> FolderAdapter | G4Adapter:
    """The adapter for the workspace's FCoP generation: fcop's Core for G4, our file layer for G2/G3."""
    if detect_generation(find_workspace_root(workspace_root)) is Generation.G4:
        from taskkernel.coordinator.fcop4.adapter import G4Adapter

        return G4Adapter(kernel, workspace_root, workspace_root / STATE_DIR)
    return FolderAdapter(kernel, workspace_root, settle_s=settle_s, grace_s=grace_s,
                         submit_on_done_report=submit_on_done_report)


class FolderAdapter:
    def __init__(self, kernel: TaskCommandKernel, workspace_root: Path, *, settle_s: float = 1.0,
                 grace_s: float = 5.0, submit_on_done_report: bool = True) -> None:
        self.fcop = open_workspace(workspace_root, allow_mixed=True, create=True)
        self.tracker = FileTracker(kernel.db)
        self.scanner = Scanner(self.fcop, settle_s=settle_s, grace_s=grace_s)
        self.ingest = Ingest(kernel, self.fcop, self.tracker, self.scanner,
                             submit_on_done_report=submit_on_done_report)
        self.projection = Projection(kernel, self.fcop, self.tracker)
        self.relay = OutboxRelay(kernel.db, {PROJECT_EFFECT: self.projection})
        self.importer = Importer.for_workspace(kernel, self.fcop, self.tracker, workspace_root, STATE_DIR)
        self.last_import: ImportReport | None = None
        self.last_ingest = IngestStats()

    def ingest_pass(self) -> int:
        """Files taken in by the live ingest; raises IngestIncomplete (after the whole pass) if any file failed.

        The first pass imports the workspace's history first, in one walk that stands as this pass's scan too
        (each file visited and read once). The import is not counted as progress: it is history, taken whole
        (its figures are in ``last_import`` and the `fcop_import` log line), and the stages after the ingest
        in this same pass see every task it adopted, so a further pass would only walk every file again."""
        if self.last_import is None and not self.importer.imported():
            self.last_import = self.importer.run(live=self.ingest)
        self.last_ingest = self.ingest.run()
        if self.last_ingest.failed:
            raise IngestIncomplete(self.last_ingest)
        return self.last_ingest.progress

    def project_pass(self) -> int:
        """Up to PROJECT_BATCH events into files: a pass stays short, so runs waiting for their TASK file and
        new claims are not held up behind a long backlog (the next pass goes on with it)."""
        return self.relay.run_pending(limit=PROJECT_BATCH)

    def ledger_pass(self) -> int:
        """Ledger rewrites are bookkeeping, not progress: they must not keep `--once` looping."""
        self.projection.refresh_ledger()
        return 0
