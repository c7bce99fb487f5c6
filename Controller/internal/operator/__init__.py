"""kopf wiring (operator.py).

kopf is imported here, before operator.py, with the official Kubernetes client hidden:
kopf imports `kubernetes.client` when it is installed, only to recognise its model
classes in what handlers return (the Controller's handlers return none), and that
import (every API and model class) would be most of the Controller's memory.
"""

import sys

if "kubernetes" not in sys.modules:
    sys.modules["kubernetes"] = None  # type: ignore[assignment]  # ImportError for kopf
    try:
        import kopf  # noqa: F401
    finally:
        del sys.modules["kubernetes"]
