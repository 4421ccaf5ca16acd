"""Kind modules for the tests of ``RECOVERY_KIND_MODULES`` (tests/test_kind_modules.py): one
that works, and the ways one can fail at start-up."""
