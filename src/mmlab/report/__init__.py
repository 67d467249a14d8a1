"""Output for people: terminal tables now; mailing-list text, HTML and bundles later."""
