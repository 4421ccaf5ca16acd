"""A kind module that cannot be imported: it needs a package that is not installed."""

import recovery_tests_no_such_package  # noqa: F401
