"""The package the -m snippets run (corpus/011, 012)."""
