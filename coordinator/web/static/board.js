// taskkernel board: live updates from /api/events and the action buttons. No build step, no framework.
(function () {
  "use strict";
  const csrf = () => (document.querySelector('meta[name="csrf-token"]') || {}).content || "";
  const status = document.getElementById("live-status");
  let pending = null;

  // A region marked data-live is re-rendered from the server when an event concerns it: the page is fetched again
  // and the region swapped in place (no reload). A region the user is typing in waits until they are done.
  function busy(region) {
    return Array.from(region.querySelectorAll("input:not([type=hidden]), textarea")).some(
      (el) => el === document.activeElement || el.value !== "");
  }

  async function refresh() {
    pending = null;
    const regions = document.querySelectorAll("[data-live]");
    if (!regions.length) return;
    const response = await fetch(location.href, { headers: { Accept: "text/html" }, credentials: "same-origin" });
    if (!response.ok) return;
    const fresh = new DOMParser().parseFromString(await response.text(), "text/html");
    regions.forEach((region) => {
      const next = fresh.querySelector(`[data-live="${region.dataset.live}"]`);
      if (!next) return;
      if (busy(region)) { region.dataset.stale = "1"; return; }
      region.innerHTML = next.innerHTML;
      delete region.dataset.stale;
      bindActions(region);
    });
    document.body.dataset.refreshed = String(Date.now());
  }

  function concerns(event) {
    const page = document.body.dataset.page;
    if (page === "task") {
      const id = document.querySelector("[data-live=task]").dataset.taskId;
      return event.task_id === id || event.stream === `gate:${id}` || event.type === "reset" ||
        (event.task_id && document.querySelector(`a[href="/tasks/${event.task_id}"]`) !== null);
    }
    return true;
  }

  function schedule(event) {
    if (!concerns(event)) return;
    if (pending === null) pending = setTimeout(refresh, 150);
  }

  function connect() {
    if (!window.EventSource || !document.querySelector("[data-live]")) { status.textContent = ""; return; }
    const source = new EventSource("/api/events");
    source.onopen = () => { status.textContent = "● live"; status.className = "live on"; };
    source.onerror = () => { status.textContent = "○ reconnecting"; status.className = "live off"; };
    source.onmessage = (m) => schedule(JSON.parse(m.data));  // one per committed event
    source.addEventListener("reset", () => schedule({ type: "reset" }));  // more missed than replayed
    window.taskkernelEvents = source;
  }

  function show(box, doc) {
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

  async function act(form, event) {
    event.preventDefault();
    const box = form.parentElement.querySelector(".result") || form.querySelector(".result") ||
      document.getElementById("action-result");
    const body = {};
    new FormData(form).forEach((value, key) => { if (key !== "csrf_token" && value !== "") body[key] = value; });
    const button = form.querySelector("button");
    if (button) button.disabled = true;
    try {
      const response = await fetch(form.dataset.action, {
        method: "POST", credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf() }, body: JSON.stringify(body) });
      const doc = await response.json();
      if (box) show(box, doc);
    } catch (err) {
      if (box) show(box, { status: "error", message: String(err) });
    } finally {
      if (button) button.disabled = false;
    }
  }

  function bindActions(root) {
    root.querySelectorAll("form.action").forEach((form) => {
      if (form.dataset.bound) return;
      form.dataset.bound = "1";
      form.addEventListener("submit", (e) => act(form, e));
    });
  }

  document.addEventListener("focusout", () => {
    if (document.querySelector("[data-live][data-stale]")) schedule({ type: "reset" });
  });
  bindActions(document);
  connect();
})();
