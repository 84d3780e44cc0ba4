"""Storage: the driver interface (base.py), the drivers, and the registry that opens one from a URI."""
