"""The domain: models, limits, reserved metadata and errors. Pure Python, no I/O."""
