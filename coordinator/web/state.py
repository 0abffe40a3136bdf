"""What one board server holds: the database, the workspace, the kernel, the sign-ins, the event hub, the actions,
what people tell a task's agent."""

from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

from taskkernel.coordinator.runners.inputs import RunInputs, role_specs
from taskkernel.coordinator.web.actions import Actions
from taskkernel.coordinator.web.auth import Gatekeeper, SignIns
from taskkernel.coordinator.web.events import EventHub
from taskkernel.coordinator.workspace import Workspace
from taskkernel.kernel.commands import TaskCommandKernel
from taskkernel.kernel.sessionlog import SessionLog
from taskkernel.kernel.store.db import Database


@dataclass
class Board:
    db: Database
    ws: Workspace | None
    kernel: TaskCommandKernel
    require_login: bool = False
    hosts: list[str] = field(default_factory=lambda: ["*"])  # the Host names requests may carry (DNS rebinding)
    sign_ins: SignIns = field(init=False)  # the store's: every server on it shares them

    def __post_init__(self) -> None:
        self.sign_ins = SignIns(self.db)
        self.grant_sessions = self.ws.grant_sessions if self.ws is not None else None
        self.gate = Gatekeeper(self.db, self.sign_ins, self.require_login)
        self.hub = EventHub(self.db)
        # the session log as coordinator/compose.py gives it to the kernel: the workspace's grant sessions
        self.session_log = (SessionLog(self.db, self.grant_sessions) if self.grant_sessions is not None
                            else SessionLog(self.db))
        # as `taskkernel task say` builds it (coordinator/cli/steer.py): the team's runners name the run sessions
        self.inputs = RunInputs(self.db, self.session_log, role_specs(self.ws.config) if self.ws is not None else {})
        self.actions = Actions(self.kernel, self.session_log, self.inputs)


def board_of(request: Request) -> Board:
    board = request.app.state.board
    assert isinstance(board, Board)
    return board
