"""The process's memory settings (glibc malloc arenas)."""
