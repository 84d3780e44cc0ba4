"""Settings, the app factory, the embedded store launcher and the CLI."""
