"""The application around the kernel: the coordinator loop, its composition root and its adapters
(FCoP files, task folders, agent runners, the CLI). Imports point from here into the core, never back."""
