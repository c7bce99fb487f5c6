"""Leader election on a coordination.k8s.io/v1 Lease, shared by every component."""

from lj_runtimekit.proto.pkg.leaderelection.elector import LeaderElector, LeaseConfig

__all__ = ["LeaderElector", "LeaseConfig"]
