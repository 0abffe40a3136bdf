"""Agent runners: execute a dispatched task with a real command or a scripted agent, under a lease."""
