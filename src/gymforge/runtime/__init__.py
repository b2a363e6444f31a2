"""The machinery jobs run on: logs and failure records, locks, scratch, GPUs and CPUs, resources, launch, tracking."""
