"""Tools around the pipeline: status, show, estimate, run-task, import-trajectories."""
