"""LJ Runtime Kit Controller: node label -> Runtime feature Jobs, and the Job Agent."""
