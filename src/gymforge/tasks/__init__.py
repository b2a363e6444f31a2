"""MLGym-format tasks: loading, files, code checks, the environment an agent acts in and the one episode runner."""
