"""Tests of the benchmarks' own code: the soaks (run short), their accounting, the fleet
simulator and the probe hubs on its simulated time, the process helpers' start on uvloop.
``make test`` runs them with ``tests/`` (pyproject's testpaths); ``tests/`` never imports
``bench``."""
