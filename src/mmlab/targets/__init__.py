"""Where a trial runs: `host` (this kernel) and, later, `qemu` (a kernel in a VM)."""
