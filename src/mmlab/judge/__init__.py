"""From stored trials to verdicts: the statistics (stats), the same-state
audit (audit), one verdict per metric and pair look by look (verdicts), and
their operating characteristics on simulated data (selftest)."""
