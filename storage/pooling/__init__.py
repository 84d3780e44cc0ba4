"""Pools: several storage backends behind one API (catalogue.py, store.py)."""
