"""Implementation of the Controller and the Job Agent."""
