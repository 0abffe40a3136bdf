// taskkernel board: live updates from /api/events and the action buttons. No build step, no framework.
(function () {
  "use strict";
  const csrf = () => (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
  const status = document.getElementById("live-status");
  // The log position the page was read at (before its reads): the feed starts right after it, so nothing that
  // commits between the render and the connection is missed.
  let lastSeen = document.body.dataset.logPosition || null;
  let source = null;
  let timer = null;
  let inFlight = false;
  let again = false;

  // A region marked data-live is re-rendered from the server when an event concerns it: the page is fetched again
  // and the region swapped in place (no reload). A region whose text field has the focus waits until it leaves;
  // text typed into a field that has lost the focus is carried over into the fresh region.
  // A choice made in a list (the message box's mode) is carried over like text. A field is known by its id, else
  // its name (the Reject form has two fields named reason). An open comment on a diff line moves into the fresh
  // region, under the same line.
  const TEXT = "input:not([type]), input[type=text], input[type=search], input[type=password], input[type=number], " +
    "textarea, select";
  const busy = (region) => region.contains(document.activeElement) && document.activeElement.matches(TEXT);

  function typed(region) {  // what was typed and not sent yet (a form being sent is cleared when it is accepted)
    const values = new Map();
    region.querySelectorAll("form.action:not([data-pending])").forEach((form) =>
      form.querySelectorAll(TEXT).forEach((field) => {
        const key = field.id || field.name;
        if (key && field.value !== field.defaultValue) values.set(`${form.dataset.action}|${key}`, field.value);
      }));
    return values;
  }

  function restore(region, values) {
    region.querySelectorAll("form.action").forEach((form) => form.querySelectorAll(TEXT).forEach((field) => {
      const value = values.get(`${form.dataset.action}|${field.id || field.name}`);
      if (value !== undefined) field.value = value;
    }));
  }

  async function refresh() {
    timer = null;
    if (inFlight) { again = true; return; }  // one fetch at a time, then one more: the newest state wins
    inFlight = true;
    try {
      const regions = document.querySelectorAll("[data-live]");
      if (!regions.length) return;
      const response = await fetch(location.href, { headers: { Accept: "text/html" }, credentials: "same-origin" });
      if (!response.ok) return;
      const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
      regions.forEach((region) => {
        const next = fresh.querySelector(`[data-live="${region.dataset.live}"]`);
        if (!next) return;
        if (busy(region)) { region.dataset.stale = "1"; return; }
        const values = typed(region);
        const open = region.querySelector("form.line-comment");
        region.innerHTML = next.innerHTML;
        restore(region, values);
        if (open) commentUnder(region, open);
        delete region.dataset.stale;
        bindActions(region);
      });
      document.body.dataset.refreshed = String(Date.now());
    } finally {
      inFlight = false;
      if (again) { again = false; schedule({ type: "again" }); }
    }
  }

  // The tables outside the event log this page shows (data-streams): only their state_changed refresh it.
  const streams = (document.body.dataset.streams || "").split(" ");

  function concerns(event) {
    if (event.type === "state_changed") return streams.includes(event.stream);
    if (document.body.dataset.page !== "task" || !event.task_id || event.type === "task_created") return true;
    const id = document.querySelector("[data-live=task]").dataset.taskId;
    return event.task_id === id || document.querySelector(`a[href="/tasks/${event.task_id}"]`) !== null;
  }

  function schedule(event) {
    if (!concerns(event)) return;
    if (timer === null) timer = setTimeout(refresh, 150);
  }

  // The task page's live output (#live-events): the feed, opened with live=TASK, says when the task's agents
  // printed more (and once as it opens); the pane then fetches what follows the last event it shows and appends each
  // as text, never as HTML, keeping the newest data-keep. A read cut at its limit means the pane is far behind: it
  // starts again from the newest.
  const pane = document.getElementById("live-events");
  let following = false;
  let followAgain = false;

  function liveItem(e) {  // the page's own <template id="live-event">, filled in
    const item = document.getElementById("live-event").content.firstElementChild.cloneNode(true);
    item.classList.add(`k-${e.kind}`);
    item.title = `${e.run_id} #${e.n}, attempt ${e.attempt}`;
    item.querySelector("time").textContent = e.at.slice(11, 19);
    item.querySelector(".kind").textContent = e.kind;
    item.querySelector(".tool").textContent = e.kind === "tool_result" ? e.tool || "" : "";
    item.querySelector(".text").textContent = e.text;
    return item;
  }

  async function liveRead(after) {
    const query = new URLSearchParams({ limit: pane.dataset.keep });
    if (after) query.set("after", after);
    const response = await fetch(`/api/tasks/${encodeURIComponent(pane.dataset.taskId)}/live?${query}`,
      { credentials: "same-origin" });
    return response.ok ? response.json() : null;
  }

  async function followLive() {
    if (following) { followAgain = true; return; }
    following = true;
    try {
      let doc = await liveRead(pane.dataset.cursor);
      if (doc && doc.more) {
        doc = await liveRead(null);
        if (doc) pane.replaceChildren();
      }
      if (!doc) return;
      const atEnd = pane.scrollTop + pane.clientHeight >= pane.scrollHeight - 8;
      doc.events.forEach((e) => pane.append(liveItem(e)));
      while (pane.children.length > Number(pane.dataset.keep)) pane.firstElementChild.remove();
      if (doc.cursor) pane.dataset.cursor = doc.cursor;
      document.getElementById("live-empty").hidden = pane.children.length > 0;
      if (atEnd) pane.scrollTop = pane.scrollHeight;
    } catch (err) {
      // the next notice (or the stream's reopening) reads again from the same cursor: nothing is lost
    } finally {
      following = false;
      if (followAgain) { followAgain = false; followLive(); }
    }
  }

  function connect() {
    if (!window.EventSource || !document.querySelector("[data-live]") || source) return;
    const query = new URLSearchParams();
    if (lastSeen !== null) query.set("after", lastSeen);
    if (pane) query.set("live", pane.dataset.taskId);
    source = new EventSource("/api/events" + (query.toString() ? `?${query}` : ""));
    // Once open, the page is read again: a table outside the event log may have changed before the stream
    // opened (state_changed has no position to replay from).
    source.onopen = () => { status.textContent = "● live"; status.className = "live on"; schedule({ type: "open" }); };
    source.onerror = () => {
      status.textContent = "○ reconnecting"; status.className = "live off";
      if (source && source.readyState === EventSource.CLOSED) {  // the server answered other than 200: try later
        source = null;
        setTimeout(() => { if (!document.hidden) connect(); }, 5000);
      }
    };
    source.onmessage = (m) => { if (m.lastEventId) lastSeen = m.lastEventId; schedule(JSON.parse(m.data)); };
    source.addEventListener("reset", (m) => { lastSeen = m.lastEventId || lastSeen; schedule({ type: "reset" }); });
    source.addEventListener("state_changed", (m) => schedule(JSON.parse(m.data)));
    source.addEventListener("live", followLive);
  }

  // A hidden tab gives its connection back (a browser opens at most six to one server over HTTP/1.1); shown again,
  // it reconnects after the last event it saw, and what it missed arrives first.
  document.addEventListener("visibilitychange", () => {
    if (document.hidden && source) { source.close(); source = null; status.textContent = "○ paused"; }
    else if (!document.hidden) connect();  // the stream's opening reads the page again
  });

  function show(doc) {
    const box = document.getElementById("action-result");
    box.className = "result " + (doc.status === "rejected" || doc.status === "error" ? "refused" : "accepted");
    box.replaceChildren();
    const head = document.createElement("p");
    const strong = document.createElement("b");
    strong.textContent = doc.status + (doc.reason ? " " + doc.reason : "");
    head.append(strong, document.createTextNode(" " + (doc.message || "")));
    head.className = "outcome";
    box.append(head);
    if (doc.hint) {
      const hint = document.createElement("pre");
      hint.className = "hint";
      hint.textContent = doc.hint;
      box.append(hint);
    }
    if (doc.reason === "permission_required" && doc.task_id && csrf() && document.body.dataset.admin) {
      const form = document.createElement("form");
      form.className = "action";
      form.dataset.action = `/api/tasks/${doc.task_id}/grant`;
      form.innerHTML = '<input type="hidden" name="permission" value="approve"><button class="grant-from-hint">Grant approve now</button>';
      box.append(form);
      bindActions(box);
    }
  }

  async function post(action, body) {  // the outcome is shown; whether it was done is returned
    const response = await fetch(action, {
      method: "POST", credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf() }, body: JSON.stringify(body) });
    show(await response.json());
    return response.ok;
  }

  async function act(form, event) {
    event.preventDefault();
    const body = {};  // fields of one name (a rejection's reason and its comments on lines) are sent as lines
    new FormData(form).forEach((value, key) => {
      if (key !== "csrf_token" && value !== "") body[key] = key in body ? `${body[key]}\n${value}` : value;
    });
    const button = form.querySelector("button");
    if (button) button.disabled = true;
    form.dataset.pending = "1";
    try {
      if (await post(form.dataset.action, body)) {
        // clear the form, and its fresh copy if a refresh replaced it meanwhile
        document.querySelectorAll("form.action").forEach((f) => { if (f.dataset.action === form.dataset.action) f.reset(); });
        form.reset();
        if (document.activeElement) document.activeElement.blur();
        schedule({});
      }
    } catch (err) {
      show({ status: "error", message: String(err) });
    } finally {
      if (button) button.disabled = false;
      delete form.dataset.pending;
    }
  }

  function bindActions(root) {
    root.querySelectorAll("form.action").forEach((form) => {
      if (form.dataset.bound) return;
      form.dataset.bound = "1";
      form.addEventListener("submit", (e) => act(form, e));
    });
  }

  // Comments on lines of the diff: the + beside a line opens the page's <template id="line-comment"> under it,
  // one at a time. While the task is in work a comment is sent at once, a steer anchored to the line (PATH:LINE);
  // on a task in review it is added to the Reject form's comments, one line each "PATH:LINE: text", which the
  // rejection sends as its reason.
  function commentUnder(root, form) {  // under its line in root, or gone with the line
    const line = [...root.querySelectorAll("pre.commented [data-anchor]")].find((l) => l.dataset.anchor === form.dataset.anchor);
    if (line) line.after(form); else form.remove();
  }

  function openComment(button) {
    document.querySelectorAll("form.line-comment").forEach((f) => f.remove());
    const form = document.getElementById("line-comment").content.firstElementChild.cloneNode(true);
    const line = button.closest("[data-anchor]");
    form.dataset.anchor = line.dataset.anchor;
    form.querySelector(".where").textContent = line.dataset.anchor;
    line.after(form);
    form.querySelector("input[name=text]").focus();
  }

  async function comment(form, event) {
    event.preventDefault();
    const text = form.elements.text.value.trim();
    const line = `${form.dataset.anchor}: ${text}`;
    if (form.dataset.mode === "collect") {
      const box = document.getElementById("reject-comments");
      box.value = box.value.trim() ? `${box.value.trimEnd()}\n${line}` : line;
      form.remove();
      show({ status: "added", message: `to the rejection's reason: ${line}` });
      return;
    }
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      if (await post(form.dataset.action, { text, mode: "steer", anchor: form.dataset.anchor })) {
        form.remove();
        schedule({});
      }
    } catch (err) {
      show({ status: "error", message: String(err) });
    } finally {
      button.disabled = false;
    }
  }

  document.addEventListener("click", (e) => {
    const target = e.target.closest("button.comment-at, form.line-comment button.cancel");
    if (!target) return;
    if (target.matches(".cancel")) target.closest("form").remove(); else openComment(target);
  });
  document.addEventListener("submit", (e) => { if (e.target.matches("form.line-comment")) comment(e.target, e); });

  document.addEventListener("focusout", () => {
    setTimeout(() => { if (document.querySelector("[data-live][data-stale]")) schedule({ type: "focus" }); }, 0);
  });
  bindActions(document);
  if (pane) pane.scrollTop = pane.scrollHeight;  // the newest output in view
  if (!document.hidden) connect();  // a tab opened in the background connects when it is first shown
})();
