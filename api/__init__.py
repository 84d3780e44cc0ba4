"""HTTP layer: FastAPI routers per resource, wire schemas, and the one error mapper."""
