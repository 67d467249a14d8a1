"""Where a trial runs: `host` (this kernel) and `qemu` (another kernel in a VM)."""
