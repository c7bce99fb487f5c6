"""Public packages of the Controller."""
