"""The kubelet PodResources API: its record of which container got which device IDs."""
