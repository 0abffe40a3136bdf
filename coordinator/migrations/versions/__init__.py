"""One module per revision, oldest first: 0001_baseline (release 0.1.0's schema), then each change.

Every revision here is also listed in ``taskkernel.kernel.store.version.REVISIONS``."""
