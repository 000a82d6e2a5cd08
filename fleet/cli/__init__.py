"""The ``fleet`` command line: thin commands over the same library calls Python users make."""
