"""One-off measurements behind the numbers in docs/ (each script's docstring says how to run it).

Not part of ``make bench``: ``bench/run.py`` and the modules it imports stay in ``bench/``.
"""
