"""The ``slicesched`` command line (:func:`service.cli.main.main`)."""
