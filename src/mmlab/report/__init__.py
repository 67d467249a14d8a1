"""Output for people: terminal tables, the mailing-list text report, the HTML
report, the evidence bundle and its standalone reproducers."""
