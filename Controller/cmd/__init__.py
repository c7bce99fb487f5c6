"""Entry points of the Controller and the Job Agent."""
