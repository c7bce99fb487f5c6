"""Command-line flags shared by every component: one-line errors and value types."""

from lj_runtimekit.proto.pkg.flags.flags import FlagParser, boolean, port, positive_seconds

__all__ = ["FlagParser", "boolean", "port", "positive_seconds"]
