"""Run bookkeeping: the trial runner, executors, run directories, records, provenance."""
