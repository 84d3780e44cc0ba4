"""The MongoDB driver (PyMongo's AsyncMongoClient): document layout in schema.py, the hot queries in
queries.py, dead-letter moves in moves.py."""
