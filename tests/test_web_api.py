"""The web board's HTTP API (issue 15), through the real `taskkernel serve` process: the CLI's documents over HTTP,
every action accepted, refused with the kernel's reason, refused without a credential (401) and, signed in with a
cookie, refused without the CSRF token (403); the event stream; the sign-in rules."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.cli_support import CLI, append_config, cli_env, new_workspace, run
from tests.web_support import board, create, issue, owner_token, sign_in, task_json, to_review


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, dict[str, str]]]:
    ws = new_workspace(tmp_path_factory.mktemp("web-api"))
    tokens = {"admin": owner_token(ws), "dev": issue(ws, "DEV", "dev-web"), "qa": issue(ws, "QA", "qa-web")}
    with board(ws) as url:
        yield ws, url, tokens


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_health_and_openapi_name_the_fixed_routes(served: tuple[Path, str, dict[str, str]]) -> None:
    ws, url, _ = served
    health = httpx2.get(url + "healthz").json()
    assert health["status"] == "ok" and health["database"] == "sqlite"
    paths = httpx2.get(url + "api/openapi.json").json()["paths"]
    for route in ("/api/tasks", "/api/tasks/{task_id}", "/api/tasks/{task_id}/{verb}", "/api/events", "/healthz",
                  "/api/tasks/{task_id}/grant", "/api/schedules/{name}/{verb}", "/api/goals/{goal_id}/cancel"):
        assert route in paths, route
    schemas = httpx2.get(url + "api/openapi.json").json()["components"]["schemas"]
    assert {"TaskRow", "TaskDocument", "CommandOutcome", "RunRow", "ScheduleView", "UsageReport",
            "SessionInput"} <= set(schemas)


def test_task_list_and_show_are_the_cli_documents(served: tuple[Path, str, dict[str, str]]) -> None:
    ws, url, _ = served
    ids = [create(ws, f"listed {i}", "--priority", "P1") for i in range(5)]
    cli_page = run("task", "list", "--limit", "3", "--json", cwd=ws)
    answer = httpx2.get(url + "api/tasks", params={"limit": 3})
    assert answer.status_code == 200 and answer.json() == json.loads(cli_page.out)
    cursor = answer.headers["x-next-cursor"]
    assert f"--cursor {cursor}" in cli_page.err and 'rel="next"' in answer.headers["link"]
    second = httpx2.get(url + "api/tasks", params={"limit": 3, "cursor": cursor}).json()
    assert second == json.loads(run("task", "list", "--limit", "3", "--cursor", cursor, "--json", cwd=ws).out)
    inbox = httpx2.get(url + "api/tasks", params={"state": "inbox", "role": "dev", "limit": 1000}).json()
    assert {t["task_id"] for t in inbox} >= set(ids)
    assert httpx2.get(url + f"api/tasks/{ids[0]}").json() == task_json(ws, ids[0])
    missing = httpx2.get(url + "api/tasks/TASK-20200101-999")
    assert missing.status_code == 404 and missing.json()["reason"] == "task_not_found"
    for bad in ({"state": "nowhere"}, {"cursor": "garbage"}, {"limit": 0}):
        refused = httpx2.get(url + "api/tasks", params=bad)
        assert refused.status_code == 400 and refused.json()["reason"] == "invalid_command", bad


def test_a_verb_without_a_credential_is_401_and_changes_nothing(served: tuple[Path, str, dict[str, str]]) -> None:
    ws, url, tokens = served
    task = create(ws, "no credential")
    for headers in ({}, bearer("tk_not-a-token"), {"authorization": "Basic abc"}):
        answer = httpx2.post(url + f"api/tasks/{task}/claim", json={}, headers=headers)
        assert answer.status_code == 401, answer.text
        assert answer.json()["status"] == "rejected" and answer.json()["reason"]
    assert task_json(ws, task)["revision"] == 1


def test_verbs_with_a_bearer_token_are_the_cli_commands(served: tuple[Path, str, dict[str, str]]) -> None:
    ws, url, tokens = served
    task = create(ws, "bearer verbs")
    claimed = httpx2.post(url + f"api/tasks/{task}/claim", json={}, headers=bearer(tokens["dev"]))
    assert claimed.status_code == 200 and claimed.json()["status"] == "accepted", claimed.text
    again = httpx2.post(url + f"api/tasks/{task}/claim", json={}, headers=bearer(tokens["dev"]))
    assert again.json()["status"] == "replayed"  # the same derived idempotency key as the CLI's
    report = httpx2.post(url + f"api/tasks/{task}/report", json={"status": "done", "body": "did it"},
                         headers=bearer(tokens["dev"]))
    assert report.json()["status"] == "accepted"
    stale = httpx2.post(url + f"api/tasks/{task}/submit", json={"expect_rev": 1}, headers=bearer(tokens["dev"]))
    assert stale.status_code == 409 and stale.json()["reason"] == "stale_task_revision"
    assert httpx2.post(url + f"api/tasks/{task}/submit", json={}, headers=bearer(tokens["dev"])).json()["status"] == \
        "accepted"
    # QA may not decide an ADMIN's task: the same refusal the CLI gives the same credential
    by_http = httpx2.post(url + f"api/tasks/{task}/approve", json={}, headers=bearer(tokens["qa"])).json()
    by_cli = run("--token", tokens["qa"], "task", "approve", task, "--json", cwd=ws)
    assert by_cli.code == 2 and by_http["status"] == "rejected" and by_http["reason"] == by_cli.json["reason"]
    no_reason = httpx2.post(url + f"api/tasks/{task}/reject", json={}, headers=bearer(tokens["admin"]))
    assert no_reason.status_code == 409 and no_reason.json()["reason"] == "invalid_command"
    rejected = httpx2.post(url + f"api/tasks/{task}/reject", json={"reason": "needs tests"},
                           headers=bearer(tokens["admin"]))
    assert rejected.json()["status"] == "accepted" and task_json(ws, task)["state"] == "active"
    unknown = httpx2.post(url + f"api/tasks/{task}/explode", json={}, headers=bearer(tokens["admin"]))
    assert unknown.status_code == 409 and unknown.json()["reason"] == "invalid_command"
    gone = httpx2.post(url + "api/tasks/TASK-20200101-999/archive", json={"reason": "x"},
                       headers=bearer(tokens["admin"]))
    assert gone.status_code == 404 and gone.json()["reason"] == "task_not_found"
    bad = httpx2.post(url + f"api/tasks/{task}/claim", json={"round": "one"}, headers=bearer(tokens["dev"]))
    assert bad.status_code == 409 and bad.json()["reason"] == "invalid_command"


def test_signed_in_changes_need_the_csrf_token(served: tuple[Path, str, dict[str, str]]) -> None:
    ws, url, tokens = served
    task = create(ws, "csrf")
    login = httpx2.post(url + "login", data={"token": tokens["dev"], "next": "/"})
    assert login.status_code == 303
    cookie = login.headers["set-cookie"]
    assert "tk_session=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert tokens["dev"] not in cookie
    client, csrf = sign_in(url, tokens["dev"])
    with contextlib.closing(client):
        missing = client.post(f"/api/tasks/{task}/claim", json={})
        assert missing.status_code == 403 and missing.json()["reason"] == "csrf_failed"
        wrong = client.post(f"/api/tasks/{task}/claim", json={}, headers={"x-csrf-token": "nope"})
        assert wrong.status_code == 403
        foreign = client.post(f"/api/tasks/{task}/claim", json={},
                              headers={"x-csrf-token": csrf, "origin": "http://evil.example"})
        assert foreign.status_code == 403 and foreign.json()["reason"] == "csrf_failed"
        assert task_json(ws, task)["revision"] == 1  # nothing happened
        ok = client.post(f"/api/tasks/{task}/claim", json={}, headers={"x-csrf-token": csrf})
        assert ok.status_code == 200 and ok.json()["status"] == "accepted"
        in_form = client.post(f"/api/tasks/{task}/report", json={"status": "in_progress", "csrf_token": csrf})
        assert in_form.json()["status"] == "accepted"
    bad = httpx2.post(url + "login", data={"token": "tk_forged", "next": "/"})
    assert bad.status_code == 401 and "tk_session" not in bad.headers.get("set-cookie", "")


def test_a_revoked_credential_is_signed_out_at_the_next_request(tmp_path: Path) -> None:
    ws = new_workspace(tmp_path)
    token = issue(ws, "DEV", "leaving")
    task = create(ws, "revoked")
    with board(ws) as url:
        client, csrf = sign_in(url, token)
        with contextlib.closing(client):
            listed = run("token", "list", "--json", cwd=ws).json
            ident = next(t["id"] for t in listed if t.get("agent") == "leaving")
            assert run("token", "revoke", ident, cwd=ws).code == 0
            answer = client.post(f"/api/tasks/{task}/claim", json={}, headers={"x-csrf-token": csrf})
            assert answer.status_code == 401
            assert "signed in as" not in client.get("/").text  # the sign-in is gone


def test_high_risk_approval_needs_a_grant_only_admin_gives(served: tuple[Path, str, dict[str, str]]) -> None:
    ws, url, tokens = served
    task = create(ws, "risky", "--risk", "high")
    to_review(ws, task, tokens["dev"])
    refused = httpx2.post(url + f"api/tasks/{task}/approve", json={}, headers=bearer(tokens["admin"]))
    assert refused.status_code == 409 and refused.json()["reason"] == "permission_required"
    assert refused.json()["hint"].startswith("taskkernel session accept admin --kind allow")
    needs = httpx2.get(url + "api/needs-you").json()
    assert task in {t["task_id"] for t in needs["needs_grant"]}
    by_dev = httpx2.post(url + f"api/tasks/{task}/grant", json={"permission": "approve"}, headers=bearer(tokens["dev"]))
    assert by_dev.status_code == 409 and by_dev.json()["status"] == "rejected"
    assert httpx2.post(url + f"api/tasks/{task}/grant", json={"permission": "destroy"},
                       headers=bearer(tokens["admin"])).json()["reason"] == "invalid_command"
    granted = httpx2.post(url + f"api/tasks/{task}/grant", json={"permission": "approve"},
                          headers=bearer(tokens["admin"]))
    assert granted.status_code == 200 and granted.json()["status"] == "accepted", granted.text
    approved = httpx2.post(url + f"api/tasks/{task}/approve", json={}, headers=bearer(tokens["admin"]))
    assert approved.json()["status"] == "accepted" and task_json(ws, task)["state"] == "done"
    archived = httpx2.post(url + f"api/tasks/{task}/archive", json={"reason": "shipped"},
                           headers=bearer(tokens["admin"]))
    assert archived.json()["status"] == "accepted", archived.text
    page = httpx2.get(url + f"api/tasks/{task}/page", headers=bearer(tokens["admin"])).json()
    assert [g["kind"] for g in page["grants"]] == ["allow"] and page["reports"][0]["body"] == "the work is done"
    for reader in ({}, bearer(tokens["dev"])):  # the grant sessions are ADMIN's: others learn only that one exists
        shown = httpx2.get(url + f"api/tasks/{task}/page", headers=reader).json()
        assert (shown["grants"], shown["grants_held"]) == ([], 1)
    inputs = httpx2.get(url + "api/sessions/admin/inputs", headers=bearer(tokens["admin"]))
    assert f"grant-approve-{task}" in {i["input_id"] for i in inputs.json()}
    assert httpx2.get(url + "api/sessions/admin/inputs").status_code == 401
    assert httpx2.get(url + "api/sessions/admin/inputs", headers=bearer(tokens["dev"])).status_code == 403


def test_schedules_pause_and_resume_as_their_creator_or_admin(served: tuple[Path, str, dict[str, str]]) -> None:
    ws, url, tokens = served
    added = run("schedule", "add", "nightly", "--every", "1h", "--action", "accept_input", "--session", "notes",
                "--kind", "message", "--payload", '{"text": "hello"}', cwd=ws)
    assert added.code == 0, added.err
    assert httpx2.post(url + "api/schedules/nightly/pause", json={}).status_code == 401
    by_dev = httpx2.post(url + "api/schedules/nightly/pause", json={}, headers=bearer(tokens["dev"]))
    assert by_dev.status_code == 409 and by_dev.json()["reason"] == "role_not_authorized"
    paused = httpx2.post(url + "api/schedules/nightly/pause", json={}, headers=bearer(tokens["admin"]))
    assert paused.status_code == 200 and paused.json()["detail"]["paused"] is True
    view = {s["name"]: s for s in httpx2.get(url + "api/schedules").json()}
    assert view["nightly"]["paused"] is True
    shown = run("schedule", "show", "nightly", "--json", cwd=ws).json
    assert set(shown) <= set(view["nightly"]) and view["nightly"]["grace"] == shown["grace"]
    resumed = httpx2.post(url + "api/schedules/nightly/resume", json={}, headers=bearer(tokens["admin"]))
    assert resumed.json()["detail"]["paused"] is False
    assert httpx2.post(url + "api/schedules/nope/pause", json={}, headers=bearer(tokens["admin"])).status_code == 404
    assert httpx2.post(url + "api/schedules/nightly/remove", json={},
                       headers=bearer(tokens["admin"])).json()["reason"] == "invalid_command"


def test_a_goal_is_cancelled_by_its_roots_authority_once(served: tuple[Path, str, dict[str, str]]) -> None:
    ws, url, tokens = served
    root = create(ws, "goal root")
    started = run("goal", "start", root, "--tokens", "1000", "--json", cwd=ws)
    assert started.code == 0, started.err
    goal = started.json["goal_id"]
    by_dev = httpx2.post(url + f"api/goals/{goal}/cancel", json={}, headers=bearer(tokens["dev"]))
    assert by_dev.status_code == 409 and by_dev.json()["reason"] == "role_not_authorized"
    ok = httpx2.post(url + f"api/goals/{goal}/cancel", json={}, headers=bearer(tokens["admin"]))
    assert ok.status_code == 200 and ok.json()["detail"]["state"] == "cancelled"
    again = httpx2.post(url + f"api/goals/{goal}/cancel", json={}, headers=bearer(tokens["admin"]))
    assert again.status_code == 409 and again.json()["reason"] == "goal_not_active"
    assert httpx2.post(url + "api/goals/nope/cancel", json={}, headers=bearer(tokens["admin"])).status_code == 404


def read_events(url: str, into: list[dict[str, Any]], ready: threading.Event, headers: dict[str, str],
                query: str = "") -> None:
    """The first three events of the log that ``GET /api/events{query}`` sends (state_changed left out)."""
    with httpx2.stream("GET", url + "api/events" + query, headers=headers, timeout=30) as stream:
        ready.set()
        for line in stream.iter_lines():
            if line.startswith("data:") and json.loads(line[5:])["global_pos"] is not None:  # events of the log
                into.append(json.loads(line[5:]))
                if len(into) >= 3:
                    return


def events_of_three_creates(ws: Path, url: str, subject: str) -> tuple[list[dict[str, Any]], list[str]]:
    """What an open `GET /api/events` receives while the CLI creates three tasks, and their ids."""
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    reader = threading.Thread(target=read_events, args=(url, seen, ready, {}), daemon=True)
    reader.start()
    assert ready.wait(30)
    time.sleep(0.3)
    created = [create(ws, f"{subject} {i}") for i in range(3)]
    reader.join(30)
    return seen, created


def test_events_stream_one_per_commit_and_replay_after_the_last_id(served: tuple[Path, str, dict[str, str]]) -> None:
    ws, url, _ = served
    start = httpx2.get(url + "healthz").json()["log_position"]
    seen, created = events_of_three_creates(ws, url, "live")
    assert [e["task_id"] for e in seen] == created and {e["state"] for e in seen} == {"inbox"}
    assert [e["global_pos"] for e in seen] == sorted(e["global_pos"] for e in seen)
    assert all(e["type"] == "task_created" and e["by"] for e in seen)
    replayed: list[dict[str, Any]] = []
    ready = threading.Event()
    read_events(url, replayed, ready, {"last-event-id": str(start)})  # all three were missed: replayed from the log
    assert [e["global_pos"] for e in replayed] == [e["global_pos"] for e in seen]


def test_pages_render_and_escape_what_agents_wrote(served: tuple[Path, str, dict[str, str]]) -> None:
    ws, url, _ = served
    task = create(ws, "<script>alert('x')</script>")
    for path in ("", f"tasks/{task}", f"tasks/{task}/file", "runs", "schedules", "usage", "usage?by=role",
                 "needs-you", "sessions", "login", "?role=DEV&risk=high"):
        page = httpx2.get(url + path)
        assert page.status_code == 200, (path, page.text[:300])
        assert "<script>alert" not in page.text or path.endswith("/file"), path
    assert "&lt;script&gt;alert" in httpx2.get(url + f"tasks/{task}").text
    reviewed = create(ws, "a person decides this one")
    to_review(ws, reviewed, issue(ws, "DEV", "dev-badges"))
    card = httpx2.get(url, params={"role": "DEV"}).text.split(f'data-task-id="{reviewed}"', 1)[1].split("</a>")[0]
    assert "waiting for you" in card and "needs a grant" not in card
    assert httpx2.get(url + "tasks/TASK-20200101-999").status_code == 404
    nowhere = httpx2.get(url + "api/nowhere")
    assert nowhere.status_code == 404 and nowhere.json()["reason"] == "not_found"
    assert "Approve" not in httpx2.get(url + f"tasks/{task}").text  # read-only without a sign-in
    assert httpx2.get(url + "login?next=https://evil.example/").text.count("evil.example") == 0


def test_require_login_closes_reads_and_a_remote_host_needs_it(tmp_path: Path) -> None:
    ws = new_workspace(tmp_path)
    import subprocess

    remote = subprocess.run([*CLI, "serve", "--host", "0.0.0.0", "--port", "0", "--json"], cwd=ws, env=cli_env(),
                            capture_output=True, text=True, timeout=60)
    assert remote.returncode == 64 and json.loads(remote.stdout.strip().splitlines()[-1])["code"] == \
        "login_required", (remote.stdout, remote.stderr)
    append_config(ws, '\n[serve]\nrequire_login = true\nhosts = ["board.example.com"]\n')
    with board(ws) as url:
        proxied = {"host": "board.example.com", "origin": "https://board.example.com"}  # a TLS proxy's request
        assert httpx2.get(url + "api/tasks", headers={**bearer(owner_token(ws)), **proxied}).status_code == 200
        assert httpx2.post(url + "login", data={"token": owner_token(ws)}, headers=proxied).status_code == 303
        assert httpx2.get(url + "api/tasks", headers={**bearer(owner_token(ws)), "host": "other.example"}
                          ).status_code == 400
        assert httpx2.get(url + "api/tasks").status_code == 401
        redirected = httpx2.get(url + "usage?by=role")
        assert redirected.status_code == 303 and redirected.headers["location"] == "/login?next=%2Fusage%3Fby%3Drole"
        assert httpx2.get(url + "api/tasks", headers=bearer(owner_token(ws))).status_code == 200
        client, _ = sign_in(url, owner_token(ws))
        with contextlib.closing(client):
            assert client.get("/runs").status_code == 200


def test_a_rebound_host_name_and_a_foreign_sign_in_are_refused(served: tuple[Path, str, dict[str, str]]) -> None:
    """Review findings: a page whose DNS name was rebound to 127.0.0.1 could read the board (Host not checked), and
    another site could sign a visitor in as its own credential (login CSRF)."""
    ws, url, tokens = served
    rebound = httpx2.get(url + "api/tasks", headers={"host": "evil.example:1234"})
    assert rebound.status_code == 400
    assert httpx2.get(url + "api/tasks", headers={"host": "localhost"}).status_code == 200
    foreign = httpx2.post(url + "login", data={"token": tokens["dev"]}, headers={"origin": "https://evil.example"})
    assert foreign.status_code == 403 and "tk_session" not in foreign.headers.get("set-cookie", "")


async def test_a_client_too_slow_for_the_feed_is_disconnected_not_left_silent(tmp_path: Path) -> None:
    """Review finding: a client whose queue filled up was dropped but its stream never ended (the end marker did
    not fit), so its page froze for ever. It now ends, and the client reconnects with its last id."""
    from taskkernel.coordinator.web.events import EventHub
    from taskkernel.kernel.store.db import Database

    db = Database(f"sqlite:///{tmp_path / 'k.db'}")
    db.create_schema()
    hub = EventHub(db, queue_size=2)
    stream = hub.follow(None)
    first = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0)  # subscribed
    for pos in range(1, 6):  # more than its queue holds, while it does not read
        hub._publish({"global_pos": pos, "type": "task_created"})
    assert hub.clients == set()
    with pytest.raises(StopAsyncIteration):  # the stream ended: the browser reconnects with Last-Event-ID
        await asyncio.wait_for(first, 5)


ACTIONS = [*(f"api/tasks/{{task}}/{verb}" for verb in ("claim", "report", "submit", "approve", "reject", "reopen",
                                                      "archive", "amend", "grant")),
           "api/schedules/{schedule}/pause", "api/schedules/{schedule}/resume", "api/goals/{goal}/cancel"]


def test_every_action_needs_a_credential_and_a_signed_in_one_its_csrf_token(
        served: tuple[Path, str, dict[str, str]]) -> None:
    ws, url, tokens = served
    task = create(ws, "guarded")
    assert run("schedule", "add", "guarded", "--every", "1h", "--action", "accept_input", "--session", "notes",
               "--kind", "message", "--payload", '{"text": "hi"}', cwd=ws).code == 0
    goal = run("goal", "start", task, "--tokens", "10", "--json", cwd=ws).json["goal_id"]
    client, _ = sign_in(url, tokens["admin"])
    with contextlib.closing(client):
        for action in ACTIONS:
            path = action.format(task=task, schedule="guarded", goal=goal)
            anonymous = httpx2.post(url + path, json={"reason": "r", "status": "done"})
            assert anonymous.status_code == 401 and anonymous.json()["reason"] == "actor_unverified", path
            no_csrf = client.post("/" + path, json={"reason": "r", "status": "done"})
            assert no_csrf.status_code == 403 and no_csrf.json()["reason"] == "csrf_failed", path
    assert task_json(ws, task)["revision"] == 1
    assert run("goal", "show", goal, "--json", cwd=ws).json["state"] == "active"
    assert not {s["name"]: s for s in httpx2.get(url + "api/schedules").json()}["guarded"]["paused"]


def test_runs_usage_and_sessions_show_what_the_coordinator_did(tmp_path: Path) -> None:
    """Runs done, retrying and failed (with their last log lines), spend by role per day, a session's inputs."""
    import sys

    ws = new_workspace(tmp_path)
    good = tmp_path / "good.py"
    good.write_text('import json, os, subprocess, sys\n'  # it reports, as an agent must (else no_report)
                    'subprocess.run([sys.executable, "-m", "taskkernel", "task", "report", '
                    'os.environ["TASKKERNEL_TASK_ID"], "--status", "done", "--body", "ok"], check=True)\n'
                    'print(json.dumps({"usage": {"tokens_in": 1200, "tokens_out": 300, "cost_usd": 0.0125}}))\n')
    bad = tmp_path / "bad.py"
    bad.write_text('import sys\nprint("about to crash", flush=True)\nprint("boom on stderr", file=sys.stderr)\n'
                   'sys.exit(3)\n')
    append_config(ws, f"""
[roles.DEV]
runner = "command"
argv = [{json.dumps(sys.executable)}, {json.dumps(str(good))}]

[roles.QA]
runner = "command"
argv = [{json.dumps(sys.executable)}, {json.dumps(str(bad))}]
max_attempts = 3
backoff = 3600

[roles.OPS]
runner = "command"
argv = [{json.dumps(sys.executable)}, {json.dumps(str(bad))}]
max_attempts = 1
""")
    built = create(ws, "build it")
    checked = run("task", "create", "--to", "QA", "--subject", "check it", "--json", cwd=ws).json["task_id"]
    shipped = run("task", "create", "--to", "OPS", "--subject", "ship it", "--json", cwd=ws).json["task_id"]
    assert run("up", str(ws), "--once", cwd=ws).code == 0
    assert run("session", "accept", "notes", "--kind", "message", "--input-id", "n1", "--payload",
               '{"text": "remember the keys"}', cwd=ws).code == 0
    with board(ws) as url:
        runs = httpx2.get(url + "api/runs").json()
        assert [r["task_id"] for r in runs["retrying"]] == [checked] and runs["retrying"][0]["retry_at"]
        [failed] = runs["failed"]
        assert failed["task_id"] == shipped and failed["log_tail"] == ["boom on stderr"]
        usage = httpx2.get(url + "api/usage", params={"by": "role"}).json()
        dev = next(r for r in usage["rows"] if r["owner"] == "DEV")
        assert (dev["tokens_in"], dev["tokens_out"], dev["cost_usd"]) == (1200, 300, 0.0125)
        assert usage["total"]["units"] == 3 and isinstance(usage["total"]["units"], int)
        assert {(d["owner"], d["tokens"]) for d in usage["days"]} >= {("DEV", 1500)}
        assert httpx2.get(url + "api/usage", params={"by": "planet"}).status_code == 400
        admin = bearer(owner_token(ws))
        assert "notes" in {s["session"] for s in httpx2.get(url + "api/sessions", headers=admin).json()}
        [note] = httpx2.get(url + "api/sessions/notes/inputs", headers=admin).json()
        exported = run("session", "export", "notes", cwd=ws)
        assert {k: v for k, v in json.loads(exported.out.splitlines()[0]).items() if k != "sig"} == note
        assert (note["accept_seq"], note["kind"], note["payload"]) == (1, "message", {"text": "remember the keys"})
        missing = httpx2.get(url + "api/sessions/nowhere/inputs", headers=admin)
        assert missing.status_code == 404 and missing.json()["reason"] == "unknown_session"
        for since in ("garbage", "0001-01-01T00:00:00+05:00", "999999w"):
            assert httpx2.get(url + "api/usage", params={"since": since}).status_code == 400, since
        assert httpx2.get(url + "api/usage", params={"since": "7d"}).json()["since"]
        assert httpx2.get(url + "api/sessions").status_code == 401
        pages = {path: httpx2.get(url + path).text for path in ("runs", "usage?by=role", f"tasks/{built}")}
        assert "boom on stderr" in pages["runs"] and "<rect" in pages["usage?by=role"]
        assert "1200 tokens in" in pages[f"tasks/{built}"]


def test_the_board_on_postgresql(pg_url: str, tmp_path: Path) -> None:
    """The same reads, filters, actions and event feed on a PostgreSQL workspace (JSON in SQL on both)."""
    from tests.coord_support import make_workspace

    ws = make_workspace(tmp_path / "ws", {}, database=pg_url).root
    admin = issue(ws, "ADMIN", "web-admin")
    dev = issue(ws, "DEV", "dev-pg")
    plain = create(ws, "plain")
    risky = create(ws, "risky on pg", "--risk", "high")
    to_review(ws, risky, dev)
    with board(ws) as url:
        assert [t["task_id"] for t in httpx2.get(url + "api/tasks", params={"risk": "high"}).json()] == [risky]
        assert httpx2.get(url + f"api/tasks/{plain}").json() == task_json(ws, plain)
        refused = httpx2.post(url + f"api/tasks/{risky}/approve", json={}, headers=bearer(admin))
        assert refused.json()["reason"] == "permission_required"
        front = httpx2.get(url).text
        assert risky in front and "needs a grant" in front
        seen, created = events_of_three_creates(ws, url, "pg live")
        assert [e["task_id"] for e in seen] == created
        page = httpx2.get(url + f"api/tasks/{risky}/page", headers=bearer(admin)).json()
        assert page["reports"][0]["body"] == "the work is done" and page["usage"]["units"] == 0
        for path in ("api/usage?by=role&since=7d", "api/runs", "api/schedules", "api/needs-you", f"tasks/{risky}",
                     "usage", "runs", "schedules", "needs-you"):
            assert httpx2.get(url + path, headers=bearer(admin)).status_code == 200, path


def test_a_page_names_the_log_position_its_feed_starts_after(served: tuple[Path, str, dict[str, str]]) -> None:
    """Review finding: a commit between a page's render and its event stream's connection was never shown. A page
    carries the position it was read at; the feed from there replays what came in between."""
    ws, url, _ = served
    html = httpx2.get(url).text
    position = int(html.split('data-log-position="', 1)[1].split('"', 1)[0])
    between = [create(ws, f"between {i}") for i in range(3)]  # after the render, before any stream connects
    seen: list[dict[str, Any]] = []
    read_events(url, seen, threading.Event(), {}, f"?after={position}")  # what board.js asks for
    assert [e["task_id"] for e in seen] == between


def test_tables_outside_the_event_log_reach_open_pages(served: tuple[Path, str, dict[str, str]]) -> None:
    """Review finding: a schedule paused or a grant given from the CLI commits no event, so open pages never
    followed it. The hub sends state_changed for the session log, schedules, runs and usage."""
    ws, url, tokens = served
    assert run("schedule", "add", "watched", "--every", "1h", "--action", "accept_input", "--session", "notes",
               "--kind", "message", "--payload", '{"text": "hi"}', cwd=ws).code == 0
    changed: list[dict[str, Any]] = []
    ready = threading.Event()

    def follow() -> None:
        with httpx2.stream("GET", url + "api/events", timeout=30) as stream:
            ready.set()
            event = None
            for line in stream.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "state_changed":
                    changed.append(json.loads(line[5:]))
                    if {c["stream"] for c in changed} >= {"schedules", "sessions"}:
                        return

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    assert ready.wait(30)
    time.sleep(0.8)
    assert run("schedule", "pause", "watched", cwd=ws).code == 0
    assert run("session", "accept", "notes", "--kind", "message", "--input-id", "watched-1", "--payload",
               '{"text": "noted"}', cwd=ws).code == 0
    reader.join(30)
    assert {c["stream"] for c in changed} >= {"schedules", "sessions"}
    assert all(c["global_pos"] is None for c in changed)


def test_the_active_column_leads_with_blocked_tasks_and_links_to_the_rest(tmp_path: Path) -> None:
    """Review finding: blocked tasks were in no column (the listing's `active` leaves them out); once they fill the
    column, its next-page link must still reach the others."""
    from taskkernel.coordinator.web.reads import Filters
    from taskkernel.coordinator.web.reads import board as board_columns
    from tests.coord_support import workspace_database

    ws = new_workspace(tmp_path)
    dev = issue(ws, "DEV", "dev-column")
    tasks = [create(ws, f"t{i}") for i in range(5)]
    for task in tasks:
        assert run("--token", dev, "task", "claim", task, cwd=ws).code == 0
    for task in tasks[:3]:
        assert run("--token", dev, "task", "report", task, "--status", "blocked", "--body", "stuck", cwd=ws).code == 0
    from taskkernel.coordinator.workspace import Workspace

    db = workspace_database(Workspace.load(ws))
    wide = board_columns(db, None, Filters(), per_column=50)["active"]
    assert [t["task_id"] for t in wide["tasks"]] == tasks[:3] + tasks[3:] and wide["count"] == 5
    assert [bool(t["blocked"]) for t in wide["tasks"]] == [True, True, True, False, False]
    full = board_columns(db, None, Filters(), per_column=3)["active"]
    assert (full["next_state"], full["next_cursor"], full["count"]) == ("active", None, 5)
    narrow = board_columns(db, None, Filters(), per_column=2)["active"]
    assert narrow["next_state"] == "blocked" and narrow["next_cursor"]
    mixed = board_columns(db, None, Filters(), per_column=4)["active"]
    assert mixed["next_state"] == "active" and mixed["next_cursor"]


def test_an_idle_stream_ends_when_its_credential_is_revoked(tmp_path: Path) -> None:
    """Review finding: an open event stream outlived its credential, and was re-checked only when an event came."""
    ws = new_workspace(tmp_path)
    token = issue(ws, "QA", "qa-stream")
    ident = next(t["id"] for t in run("token", "list", "--json", cwd=ws).json if t.get("agent") == "qa-stream")
    with board(ws) as url:
        ended = threading.Event()

        def follow() -> None:
            with httpx2.stream("GET", url + "api/events", headers=bearer(token), timeout=60) as stream:
                for _ in stream.iter_lines():
                    pass
            ended.set()

        threading.Thread(target=follow, daemon=True).start()
        time.sleep(1)
        assert not ended.is_set()
        assert run("token", "revoke", ident, cwd=ws).code == 0
        assert ended.wait(15), "the stream of a revoked credential stayed open with nothing committed"


def test_quiet_pages_send_no_state_changed_and_runs_do(tmp_path: Path) -> None:
    """Markers move with what pages show, not with reads (no refresh storm); a run and its usage move theirs."""
    import sys

    ws = new_workspace(tmp_path)
    agent = tmp_path / "agent.py"
    agent.write_text('import json\nprint(json.dumps({"usage": {"tokens_in": 10, "tokens_out": 5}}))\n')
    append_config(ws, f"""
[roles.DEV]
runner = "command"
argv = [{json.dumps(sys.executable)}, {json.dumps(str(agent))}]
""")
    create(ws, "run me")
    with board(ws) as url:
        changed: list[str] = []
        stop = threading.Event()

        def follow() -> None:
            with httpx2.stream("GET", url + "api/events", timeout=60) as stream:
                event = None
                for line in stream.iter_lines():
                    if line.startswith("event:"):
                        event = line[6:].strip()
                    elif line.startswith("data:") and event == "state_changed":
                        changed.append(json.loads(line[5:])["stream"])
                    if stop.is_set():
                        return

        threading.Thread(target=follow, daemon=True).start()
        for path in ("", "runs", "schedules", "usage", "needs-you", "api/runs", "api/usage", "api/needs-you"):
            assert httpx2.get(url + path).status_code == 200
        time.sleep(1.5)
        assert changed == [], changed
        assert run("up", str(ws), "--once", cwd=ws).code == 0
        deadline = time.monotonic() + 10
        while not {"runs", "usage"} <= set(changed) and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        assert {"runs", "usage"} <= set(changed), changed


async def test_a_store_error_while_rechecking_a_credential_keeps_the_stream(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Review finding: a database hiccup during an open stream's periodic credential check crashed the stream (and
    the browser's reconnect got a 500, which ends EventSource's retries): only a refusal ends it now. The check
    runs on its own clock, idle or not."""
    from types import SimpleNamespace

    import sqlalchemy as sa

    from taskkernel.coordinator.web import api
    from taskkernel.coordinator.web.events import EventHub
    from taskkernel.kernel.store.db import Database

    db = Database(f"sqlite:///{tmp_path / 'k.db'}")
    db.create_schema()
    checks: list[bool] = []

    def failing_reader(request: object, heartbeat: bool = True) -> None:
        checks.append(heartbeat)
        raise sa.exc.OperationalError("SELECT 1", {}, Exception("database is locked"))

    board = SimpleNamespace(hub=EventHub(db), gate=SimpleNamespace(reader=failing_reader))
    monkeypatch.setattr(api, "RECHECK_SECONDS", 0.05)
    monkeypatch.setattr(api, "board_of", lambda request: board)
    stream = api.events(SimpleNamespace(), object(), None, None)  # a signed-in caller's stream
    first = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.4)  # idle: re-checked several times, each failing
    board.hub._publish({"global_pos": 7, "stream": "task:T", "type": "task_created", "task_id": "T",
                        "state": "inbox", "by": "ADMIN:x", "at": "now"})
    sent = await asyncio.wait_for(first, 5)
    assert sent.id == "7" and len(checks) >= 2 and not any(checks)  # never an agent's heartbeat
    await stream.aclose()
