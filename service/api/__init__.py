"""The live service's HTTP API: app factory, dependencies, routers, schemas and the service layer."""
