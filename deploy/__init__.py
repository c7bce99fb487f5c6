"""LJ Runtime Kit deployment helper (rendering and checks behind deploy/deploy-all.sh)."""
