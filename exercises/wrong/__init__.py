"""Wrong solutions, one mistake each (named in the file's docstring): every exercise's check must
reject each of its own (``tests/test_exercises.py``). ``<exercise>_<mistake>.py``."""
