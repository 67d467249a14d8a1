"""Where the time went: perf stacks, lock contention, and their differences
between arms.  Always collected in trials of its own, never mixed into the
clean timing samples."""
