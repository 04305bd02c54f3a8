"""The web console for people (``slicesched console``): :func:`service.webconsole.app.create_console`."""
