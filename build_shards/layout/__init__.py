"""Layout: which split each sample lands in, and the options of a build that decide its bytes."""
