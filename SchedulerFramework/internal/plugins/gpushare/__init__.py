"""GpuShare: device-level placement of whole GPUs, TDM slices and MIG instances."""
