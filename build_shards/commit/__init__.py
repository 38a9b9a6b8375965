"""Commit: the output folder of a build: its lock, what a rerun keeps, the merged manifest, the card."""
