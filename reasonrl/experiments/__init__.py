"""Experiments: sweeps over settings and seeds (:mod:`~reasonrl.experiments.sweep`, the sweep
file; :mod:`~reasonrl.experiments.runner`, running it), their statistics
(:mod:`~reasonrl.experiments.stats`: intervals over seeds, the paired bootstrap, verdicts) and
their summary (:mod:`~reasonrl.experiments.summary`). ``reasonrl sweep`` is the command."""
