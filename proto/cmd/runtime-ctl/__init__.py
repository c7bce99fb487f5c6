"""`lj-runtime-ctl`: inspect a Runtime through the project's client."""
