"""kopf wiring: watches, work queue, resync, leader election and health around the reconcilers."""
