"""The `taskkernel` command line: JSON on stdout for machines, rich summaries on stderr for people."""
