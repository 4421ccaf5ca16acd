"""Examples of runtimes using the recovery service (not part of the installed package)."""
