"""The config's sections, one module per part of the pipeline; `gymforge.core.config` assembles them into
`GymforgeConfig` and re-exports every model, so code imports them from there."""
