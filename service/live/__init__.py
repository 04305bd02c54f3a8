"""The control plane without HTTP: state, stores, the placement loop, tenancy, workflows,
predictors, the supervisor and the settings; :class:`~service.live.service.LiveService` composes them."""
