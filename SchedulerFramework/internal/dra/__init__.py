"""Dynamic Resource Allocation: the cluster's devices and claims, and the allocator."""
