"""Tests of what deploys Charon: the images file sets, composes profiles, the Kubernetes manifests."""
