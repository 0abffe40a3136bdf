"""The web board (`taskkernel serve`, docs/web.md): FastAPI over the kernel, for the people who supervise.

models.py the typed read models (SQLModel), reads.py what each page and API route reads, events.py the one tail of
the event log fanned out to every server-sent-events client, auth.py sign-in, session cookies and CSRF,
actions.py each button as the kernel command the CLI submits, api.py the JSON routes, pages.py the HTML, app.py
the application. Reads never build the command kernel; every write goes through TaskCommandKernel, the session log
or the schedules exactly as the CLI's do, with the same reason codes.
"""
