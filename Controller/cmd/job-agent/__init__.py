"""The Job Agent (lj-job-agent)."""
