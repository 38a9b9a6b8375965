"""Probe: look at a build's first items before it runs: their schema and their cost."""
