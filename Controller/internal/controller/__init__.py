"""The node reconciler (label -> Job) and its Job steps (a finished Job's result -> Node)."""
