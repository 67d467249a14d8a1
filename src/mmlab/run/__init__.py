"""Running a stored plan: the runner (trials, looks, added rounds), the
matched-state controls it adds, and narrowing, a search made of experiments."""
