REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # The one mapping of every error to {"code", "detail"} (STYLE R14, docs/api.md "Error catalog").
    "EXCEPTION_HANDLER": "connector.api.exceptions.connector_exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Connector V2 API",
    "DESCRIPTION": "Admission, replay and read endpoints of the Connector V2 execution engine (docs/api.md).",
    "VERSION": "2.0.0",
    # /api/docs/ works offline: Redoc and Swagger UI come from the pinned drf-spectacular-sidecar package's
    # static files, not a CDN (D-163).
    "REDOC_DIST": "SIDECAR",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    # Same-named enums of different endpoints get explicit component names instead of hashed ones.
    "ENUM_NAME_OVERRIDES": {
        "ReceiptAdmissionOutcomeEnum": ["created", "duplicate", "v1_accepted"],
        "ReplayAdmissionOutcomeEnum": ["created", "duplicate"],
        "ErrorCodeEnum": "connector.api.exceptions.API_ERROR_CODE_CHOICES",
    },
}
