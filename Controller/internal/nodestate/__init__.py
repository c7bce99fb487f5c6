"""The per-node feature state machine kept on the Node."""
