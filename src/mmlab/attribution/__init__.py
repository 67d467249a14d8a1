"""Where the time went: perf stacks, lock contention, tracepoint counts,
in-guest traces and kernel instructions by function, and their differences
between arms.  Always collected in trials of its own, never mixed into the
clean timing samples."""
