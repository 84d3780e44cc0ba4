"""The Redis driver: one Lua script per atomic operation (lua/*.lua), keys built in keys.py."""
